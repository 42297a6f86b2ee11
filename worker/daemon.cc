#include "worker/daemon.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"
#include "core/rpc/auth.h"
#include "core/rpc/channel.h"
#include "core/rpc/server.h"
#include "core/rpc/stream_limits.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "tern/v1/worker.grpc.pb.h"
#include "worker/gossip_service.h"
#include "worker/metrics.h"
#include "worker/trainer_service.h"

namespace tern {
namespace {

StreamLimitOptions InitialLimits(StreamLimitOptions o) {
  if (o.max_buffered_bytes == 0) o.max_buffered_bytes = uint64_t{64} << 20;
  return o;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Start(
    DaemonOptions options, const WorkerRegistries* registries) {
  const CodecRegistry* codecs = registries->codecs.get();
  if (!options.peer_names.empty() && options.tls.ca.empty() && options.tls.tokens.empty()) {
    return absl::InvalidArgumentError(
        "--peer_names needs --tls_ca or --tokens: without them no caller has a name to check");
  }
  std::shared_ptr<CallAuthenticator> authenticator;
  TERN_ASSIGN_OR_RETURN(auto server_credentials,
                        ServerCredentialsFor(options.tls, options.listen, &authenticator));
  TERN_ASSIGN_OR_RETURN(auto channel_credentials, ChannelCredentialsFor(options.tls));
  auto transport = std::make_unique<GrpcTransport>(
      options.engine.worker_id, std::move(channel_credentials), options.striping);
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<RoundEngine> engine,
                        RoundEngine::Create(options.engine, registries, transport.get()));
  std::unique_ptr<WorkerDaemon> d(
      new WorkerDaemon(std::move(options), codecs, std::move(transport), std::move(engine)));
  d->authenticator_ = std::move(authenticator);
  TERN_ASSIGN_OR_RETURN(
      d->server_, StartGrpcServer(d->options_.listen, {d->gossip_.get(), d->trainer_service_.get()},
                                  &d->port_, std::move(server_credentials)));
  // A trainer may register from now on; peers may push once it can train.
  SetHealth(*d->server_, {v1::Trainer::service_full_name()}, true);
  d->UpdateHealth();
  if (!d->options_.metrics_listen.empty()) {
    const RoundEngine* e = d->engine_.get();
    const EngineOptions* o = &d->options_.engine;
    const CallAuthenticator* a = d->authenticator_.get();
    TERN_ASSIGN_OR_RETURN(
        d->metrics_, MetricsEndpoint::Start(d->options_.metrics_listen, [e, o, a](MetricSet& m) {
          CollectWorkerMetrics(*e, *o, m);
          if (a != nullptr) CollectAuthMetrics(*a, *o, m);
        }));
  }
  if (!d->options_.round_log.empty()) {
    TERN_RETURN_IF_ERROR(d->trainer_port_->OpenRoundLog(d->options_.round_log));
  }
  d->loop_ = std::thread([p = d.get()] { p->LoopThread(); });
  return d;
}

WorkerDaemon::WorkerDaemon(DaemonOptions options, const CodecRegistry* codecs,
                           std::unique_ptr<GrpcTransport> transport,
                           std::unique_ptr<RoundEngine> engine)
    : options_(std::move(options)),
      codecs_(codecs),
      transport_(std::move(transport)),
      engine_(std::move(engine)),
      limits_(std::make_unique<StreamLimits>(InitialLimits(options_.limits))),
      trainer_port_(std::make_unique<TrainerPort>(
          TrainerPortOptions{.worker_id = options_.engine.worker_id,
                             .num_workers = options_.engine.num_workers,
                             .algorithm = options_.engine.algorithm,
                             .peers_known = [t = transport_.get()] { return t->has_peers(); },
                             .registered = [this](uint64_t n) { Registered(n); }},
          engine_.get())),
      segment_(std::make_unique<TrainerSegment>(options_.engine.worker_id, engine_.get(),
                                                trainer_port_.get())),
      gossip_(std::make_unique<GossipService>(
          GossipServiceOptions{
              .worker_id = options_.engine.worker_id,
              .run_id = options_.engine.run_id,
              .max_bundle_bytes = options_.max_bundle_bytes,
              .peer_names = options_.peer_names,
              .post = [this](std::function<void(bool)> job) { Post(std::move(job)); }},
          engine_.get(), limits_.get(), codecs_)),
      trainer_service_(std::make_unique<TrainerService>(
          TrainerServiceOptions{
              .max_bundle_bytes = options_.max_bundle_bytes,
              .max_params = options_.engine.max_params,
              .trainer_names = options_.trainer_names,
              .post = [this](std::function<void(bool)> job) { Post(std::move(job)); }},
          trainer_port_.get(), segment_.get(), engine_.get(), codecs_)) {}

void WorkerDaemon::Registered(uint64_t num_params) {
  if (options_.limits.max_buffered_bytes == 0) {
    limits_->SetMaxBufferedBytes(
        std::max<uint64_t>(uint64_t{64} << 20, kAutoBufferedModels * 4 * num_params));
  }
  UpdateHealth();
}

WorkerDaemon::~WorkerDaemon() { Shutdown(absl::Seconds(1)); }

std::shared_ptr<grpc::Channel> WorkerDaemon::InProcessChannel() {
  return server_->InProcessChannel(TernChannelArguments());
}

absl::Status WorkerDaemon::SetPeers(const std::vector<std::string>& addresses, bool absent_ok) {
  TERN_RETURN_IF_ERROR(transport_->SetPeers(addresses, absent_ok));
  UpdateHealth();
  return absl::OkStatus();
}

absl::Status WorkerDaemon::SetPeer(int id, const std::string& address) {
  TERN_ASSIGN_OR_RETURN(const bool moved, transport_->SetPeer(id, address));
  if (moved) engine_->PeerReplaced(id);
  return absl::OkStatus();
}

bool WorkerDaemon::ready() {
  return engine_->initialized() && (options_.engine.num_workers <= 1 || transport_->has_peers());
}

void WorkerDaemon::UpdateHealth() {
  const bool serving = ready();
  // Under mu_, so it cannot undo Shutdown()'s NOT_SERVING (the health service calls nothing of
  // ours back).
  absl::MutexLock lock(&mu_);
  if (!shut_down_) SetHealth(*server_, {"", v1::Gossip::service_full_name()}, serving);
}

void WorkerDaemon::Post(std::function<void(bool)> job) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      jobs_.push_back(std::move(job));
      return;
    }
  }
  job(true);
}

void WorkerDaemon::LoopThread() {
  while (true) {
    std::function<void(bool)> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerDaemon* d)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) { return d->stopping_ || !d->jobs_.empty(); },
          this));
      if (jobs_.empty()) return;  // stopping, and nothing left to answer
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    trainer_port_->RunExclusive([&job] { job(false); });
  }
}

void WorkerDaemon::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  metrics_.reset();
  if (server_ != nullptr) server_->GetHealthCheckService()->SetServingStatus(false);
  engine_->Shutdown();  // a step waiting for neighbours returns now
  // The doorbell stopped and the model back in the engine's memory before the segment goes;
  // then every later trainer call is refused.
  segment_->Close();
  trainer_port_->Close();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  if (server_ != nullptr) {
    // Peers' push streams wait for their next message, never ending by themselves.
    limits_->CancelWaiting();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    server_->Wait();
  }
  transport_->Drain();
}

}  // namespace tern
