#include "worker/daemon.h"

#include <unistd.h>

#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/chunking.h"
#include "common/json_lines.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "core/rpc/auth.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/server.h"
#include "core/rpc/status.h"
#include "core/rpc/stream_limits.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "spdlog/spdlog.h"
#include "tern/v1/records.pb.h"
#include "tern/v1/worker.grpc.pb.h"
#include "worker/gossip_service.h"
#include "worker/metrics.h"

namespace tern {
namespace {

// The shared-memory segment's header (docs/trainer-shm.md): magic, then little-endian u64s.
constexpr char kShmMagic[8] = {'T', 'E', 'R', 'N', 'S', 'H', 'M', '1'};
constexpr size_t kShmHeader = 64;
constexpr size_t kShmAlign = 64;

size_t AlignUp(size_t n) { return (n + kShmAlign - 1) / kShmAlign * kShmAlign; }

StreamLimitOptions InitialLimits(StreamLimitOptions o) {
  if (o.max_buffered_bytes == 0) o.max_buffered_bytes = uint64_t{64} << 20;
  return o;
}

grpc::Status Unavailable() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is shutting down");
}

}  // namespace

v1::StepResult StepResultOf(const StepOutcome& out) {
  v1::StepResult result;
  result.set_step(static_cast<uint64_t>(out.step));
  result.set_lr(out.lr);
  for (int j : out.mixed) result.add_mixed(static_cast<uint32_t>(j));
  for (int j : out.dropped) result.add_dropped(static_cast<uint32_t>(j));
  *result.mutable_step_stats() = out.delta;
  result.set_worker_seconds(out.seconds);
  return result;
}

// ---------------------------------------------------------------------------------------------
// Trainer: Register and Step run on the round-loop thread; Snapshot and Stats answer at once.
class WorkerDaemon::TrainerService final : public v1::Trainer::CallbackService {
 public:
  explicit TrainerService(WorkerDaemon* d) : d_(d) {}

  grpc::ServerReadReactor<v1::RegisterRequest>* Register(grpc::CallbackServerContext*,
                                                         v1::RegisterReply* reply) override {
    return new RegisterCall(d_, reply);
  }
  grpc::ServerBidiReactor<v1::StepRequest, v1::StepReply>* Step(
      grpc::CallbackServerContext*) override {
    return new StepCall(d_);
  }
  grpc::ServerWriteReactor<v1::SnapshotReply>* Snapshot(
      grpc::CallbackServerContext*, const v1::SnapshotRequest* request) override {
    return new SnapshotCall(d_, *request);
  }
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const v1::StatsRequest*,
                                  v1::WorkerStats* reply) override {
    *reply = d_->engine_->Stats();
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* OpenSharedMemory(grpc::CallbackServerContext* ctx,
                                             const v1::OpenSharedMemoryRequest*,
                                             v1::SharedMemoryInfo* reply) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    d_->Post([d = d_, reactor, reply](bool cancelled) {
      if (cancelled) {
        reactor->Finish(Unavailable());
        return;
      }
      d->exec_mu_.AssertHeld();  // a job of the loop
      absl::StatusOr<v1::SharedMemoryInfo> info = d->OpenSharedOnLoop();
      if (info.ok()) *reply = *std::move(info);
      reactor->Finish(ToGrpcStatus(info.status()));
    });
    return reactor;
  }
  grpc::ServerUnaryReactor* StepShared(grpc::CallbackServerContext* ctx,
                                       const v1::StepInfo* request,
                                       v1::StepResult* reply) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    d_->Post([d = d_, reactor, request, reply](bool cancelled) {
      if (cancelled) {
        reactor->Finish(Unavailable());
        return;
      }
      d->exec_mu_.AssertHeld();  // a job of the loop
      absl::StatusOr<v1::StepResult> r = d->StepSharedOnLoop(*request);
      if (r.ok()) *reply = *std::move(r);
      reactor->Finish(ToGrpcStatus(r.status()));
    });
    return reactor;
  }

 private:
  class RegisterCall final : public grpc::ServerReadReactor<v1::RegisterRequest> {
   public:
    RegisterCall(WorkerDaemon* d, v1::RegisterReply* reply)
        : d_(d), reply_(reply), assembler_(d->options_.max_bundle_bytes) {
      StartRead(&req_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(
            ToGrpcStatus(absl::InvalidArgumentError("stream ended before the model's last chunk")));
        return;
      }
      std::optional<absl::StatusOr<v1::TensorBundle>> bundle =
          Feed(assembler_, std::move(*req_.mutable_chunk()));
      if (!bundle) {
        StartRead(&req_);
        return;
      }
      if (!bundle->ok()) {
        Finish(ToGrpcStatus(bundle->status()));
        return;
      }
      d_->Post([this, b = **std::move(bundle)](bool cancelled) {
        if (cancelled) {
          Finish(Unavailable());
          return;
        }
        d_->exec_mu_.AssertHeld();  // a job of the loop
        Finish(ToGrpcStatus(Run(b)));
      });
    }
    void OnDone() override { delete this; }

   private:
    absl::Status Run(const v1::TensorBundle& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d_->exec_mu_) {
      TERN_ASSIGN_OR_RETURN(std::vector<ParamTensor> layout,
                            LayoutFromBundle(b, d_->options_.engine.max_params));
      std::vector<float> x0(LayoutNumel(layout));
      TERN_RETURN_IF_ERROR(BundleToFlat(b, layout, *d_->codecs_, absl::MakeSpan(x0)));
      TERN_ASSIGN_OR_RETURN(*reply_, d_->RegisterOnLoop(layout, x0));
      return absl::OkStatus();
    }

    WorkerDaemon* const d_;
    v1::RegisterReply* const reply_;
    BundleAssembler assembler_;
    v1::RegisterRequest req_;
  };

  class StepCall final : public grpc::ServerBidiReactor<v1::StepRequest, v1::StepReply> {
   public:
    explicit StepCall(WorkerDaemon* d) : d_(d), assembler_(d->options_.max_bundle_bytes) {
      StartRead(&req_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(ToGrpcStatus(
            absl::InvalidArgumentError("stream ended before the gradient's last chunk")));
        return;
      }
      if (first_) {
        if (!req_.has_info()) {
          Finish(ToGrpcStatus(
              absl::InvalidArgumentError("the first StepRequest must carry StepInfo")));
          return;
        }
        info_ = req_.info();
        first_ = false;
      }
      std::optional<absl::StatusOr<v1::TensorBundle>> bundle =
          Feed(assembler_, std::move(*req_.mutable_chunk()));
      if (!bundle) {
        StartRead(&req_);
        return;
      }
      if (!bundle->ok()) {
        Finish(ToGrpcStatus(bundle->status()));
        return;
      }
      d_->Post([this, b = **std::move(bundle)](bool cancelled) {
        if (cancelled) {
          Finish(Unavailable());
          return;
        }
        d_->exec_mu_.AssertHeld();  // a job of the loop
        absl::Status s = Run(b);
        if (!s.ok()) {
          Finish(ToGrpcStatus(s));
          return;
        }
        StartWrite(&replies_[0]);
      });
    }
    void OnWriteDone(bool ok) override { WriteNextOrFinish(this, ok, replies_, &next_); }
    void OnDone() override { delete this; }

   private:
    // On the loop thread: decode the gradient, run the step, stage the reply.
    absl::Status Run(const v1::TensorBundle& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d_->exec_mu_) {
      RoundEngine* e = d_->engine_.get();
      if (!e->initialized()) return absl::FailedPreconditionError("register the model first");
      std::vector<ParamTensor> layout = e->layout();
      std::vector<float> grad(LayoutNumel(layout));
      TERN_RETURN_IF_ERROR(BundleToFlat(b, layout, *d_->codecs_, absl::MakeSpan(grad)));
      StepInput in;
      in.step = static_cast<int64_t>(info_.step());
      in.lr = info_.lr();
      in.loss = info_.loss();
      in.compute_seconds = info_.compute_seconds();
      in.io_seconds = info_.io_seconds();
      in.grad = grad;
      TERN_ASSIGN_OR_RETURN(StepOutcome out, d_->StepOnLoop(in));
      const v1::StepResult result = StepResultOf(out);
      TERN_ASSIGN_OR_RETURN(v1::TensorBundle params, FlatToBundle(layout, e->params()));
      params.set_round(static_cast<uint64_t>(out.step));
      TERN_ASSIGN_OR_RETURN(replies_, ChunkedReplies(params, static_cast<uint64_t>(out.step),
                                                     &v1::StepReply::mutable_result, result));
      return absl::OkStatus();
    }

    WorkerDaemon* const d_;
    BundleAssembler assembler_;
    v1::StepRequest req_;
    v1::StepInfo info_;
    bool first_ = true;
    std::vector<v1::StepReply> replies_;
    size_t next_ = 0;
  };

  class SnapshotCall final : public grpc::ServerWriteReactor<v1::SnapshotReply> {
   public:
    SnapshotCall(WorkerDaemon* d, const v1::SnapshotRequest& request) : d_(d) {
      absl::Status s = Prepare(static_cast<int64_t>(request.round()));
      if (!s.ok()) {
        Finish(ToGrpcStatus(s));
      } else {
        StartWrite(&replies_[0]);
      }
    }
    void OnWriteDone(bool ok) override { WriteNextOrFinish(this, ok, replies_, &next_); }
    void OnDone() override { delete this; }

   private:
    absl::Status Prepare(int64_t step) {
      RoundEngine* e = d_->engine_.get();
      v1::WorkerStats stats = e->Stats();  // before the snapshot, so they never run ahead of it
      TERN_ASSIGN_OR_RETURN(std::vector<float> x, e->GetSnapshot(step));
      TERN_ASSIGN_OR_RETURN(v1::TensorBundle b, FlatToBundle(e->layout(), x));
      b.set_round(static_cast<uint64_t>(step));
      TERN_ASSIGN_OR_RETURN(replies_, ChunkedReplies(b, static_cast<uint64_t>(step),
                                                     &v1::SnapshotReply::mutable_stats, stats));
      return absl::OkStatus();
    }

    WorkerDaemon* const d_;
    std::vector<v1::SnapshotReply> replies_;
    size_t next_ = 0;
  };

  WorkerDaemon* const d_;
};

// ---------------------------------------------------------------------------------------------

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
  TERN_ASSIGN_OR_RETURN(d->server_,
                        StartGrpcServer(d->options_.listen, {d->gossip_.get(), d->trainer_.get()},
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
    absl::MutexLock exec(&d->exec_mu_);  // (no step runs yet; the members are exec_mu_'s)
    d->round_log_.open(d->options_.round_log, std::ios::trunc);
    if (!d->round_log_) {
      return absl::InvalidArgumentError(absl::StrCat("cannot write ", d->options_.round_log));
    }
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
      gossip_(std::make_unique<GossipService>(
          GossipServiceOptions{.worker_id = options_.engine.worker_id,
                               .max_bundle_bytes = options_.max_bundle_bytes,
                               .peer_names = options_.peer_names},
          engine_.get(), limits_.get(), codecs_)),
      trainer_(std::make_unique<TrainerService>(this)) {}

WorkerDaemon::~WorkerDaemon() { Shutdown(absl::Seconds(1)); }

std::shared_ptr<grpc::Channel> WorkerDaemon::InProcessChannel() {
  return server_->InProcessChannel(TernChannelArguments());
}

absl::Status WorkerDaemon::SetPeers(const std::vector<std::string>& addresses) {
  TERN_RETURN_IF_ERROR(transport_->SetPeers(addresses));
  UpdateHealth();
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

absl::StatusOr<v1::RegisterReply> WorkerDaemon::RegisterOnLoop(
    const std::vector<ParamTensor>& layout, absl::Span<const float> x0) {
  RoundEngine* e = engine_.get();
  TERN_RETURN_IF_ERROR(e->Init(layout, x0));
  if (options_.limits.max_buffered_bytes == 0) {
    limits_->SetMaxBufferedBytes(
        std::max<uint64_t>(uint64_t{64} << 20, kAutoBufferedModels * 4 * x0.size()));
  }
  const EngineOptions& o = options_.engine;
  v1::RegisterReply reply;
  reply.set_worker_id(static_cast<uint32_t>(o.worker_id));
  reply.set_num_workers(static_cast<uint32_t>(o.num_workers));
  reply.set_algorithm(o.algorithm);
  reply.set_momentum(e->momentum());
  reply.set_step(static_cast<uint64_t>(e->next_step()));
  last_step_end_ = absl::Now();
  spdlog::info("worker {}: model registered ({} tensors, {} parameters)", o.worker_id,
               layout.size(), x0.size());
  UpdateHealth();
  return reply;
}

absl::StatusOr<StepOutcome> WorkerDaemon::StepOnLoop(const StepInput& in) {
  RoundEngine* e = engine_.get();
  if (!e->initialized()) return absl::FailedPreconditionError("register the model first");
  if (!transport_->has_peers() && options_.engine.num_workers > 1) {
    return absl::UnavailableError("this worker does not know its peers yet");
  }
  const bool begun = std::exchange(step_begun_, false);
  TERN_ASSIGN_OR_RETURN(StepOutcome out, begun ? e->FinishStep(in) : e->Step(in));
  LogStep(out);
  return out;
}

absl::StatusOr<v1::SharedMemoryInfo> WorkerDaemon::OpenSharedOnLoop() {
  if (!engine_->initialized()) return absl::FailedPreconditionError("register the model first");
  const size_t n = engine_->params().size();
  const size_t grad_at = kShmHeader, params_at = grad_at + AlignUp(n * sizeof(float));
  // A trainer that opens again gets a fresh segment.
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<SharedSegment> segment,
                        SharedSegment::Create(absl::StrCat("/tern-w", options_.engine.worker_id,
                                                           "-", getpid(), "-", ++shm_serial_),
                                              params_at + AlignUp(n * sizeof(float))));
  uint8_t* base = segment->data();
  std::memcpy(base, kShmMagic, sizeof(kShmMagic));
  const uint64_t header[3] = {n, grad_at, params_at};
  std::memcpy(base + 8, header, sizeof(header));
  shm_grad_at_ = grad_at;
  // The parameters now live in the segment: the trainer reads them in place after every step.
  // (The old segment, if any, is released only after this copies out of it.)
  std::unique_ptr<SharedSegment> old = std::move(shm_);
  shm_ = std::move(segment);
  TERN_RETURN_IF_ERROR(
      engine_->BindParams(absl::MakeSpan(reinterpret_cast<float*>(base + params_at), n)));
  old.reset();
  v1::SharedMemoryInfo info;
  info.set_path(shm_->path());
  info.set_size(shm_->size());
  info.set_num_params(n);
  info.set_grad_offset(grad_at);
  info.set_params_offset(params_at);
  if (doorbell_ == nullptr) {
    absl::StatusOr<std::unique_ptr<SeqpacketServer>> bell = SeqpacketServer::Start(
        absl::StrCat("/dev/shm/tern-w", options_.engine.worker_id, "-", getpid(), ".sock"),
        [this](absl::string_view request) { return DoorbellStep(request); });
    if (bell.ok()) {
      doorbell_ = *std::move(bell);
    } else {  // Trainer.StepShared still works
      spdlog::warn("worker {}: no doorbell socket: {}", options_.engine.worker_id,
                   bell.status().ToString());
    }
  }
  if (doorbell_ != nullptr) info.set_doorbell_path(doorbell_->path());
  spdlog::info("worker {}: trainer steps through shared memory {}", options_.engine.worker_id,
               shm_->path());
  return info;
}

absl::StatusOr<v1::StepResult> WorkerDaemon::StepSharedOnLoop(const v1::StepInfo& info) {
  if (shm_ == nullptr) return absl::FailedPreconditionError("call OpenSharedMemory first");
  const size_t n = engine_->params().size();
  // The offsets are ours, never read back from the shared bytes (the trainer writes there).
  StepInput in;
  in.step = static_cast<int64_t>(info.step());
  in.lr = info.lr();
  in.loss = info.loss();
  in.compute_seconds = info.compute_seconds();
  in.io_seconds = info.io_seconds();
  in.grad = absl::MakeConstSpan(reinterpret_cast<const float*>(shm_->data() + shm_grad_at_), n);
  TERN_ASSIGN_OR_RETURN(StepOutcome out, StepOnLoop(in));
  // The parameters are already in the segment (bound there by OpenSharedMemory).
  return StepResultOf(out);
}

std::string WorkerDaemon::DoorbellStep(absl::string_view request) {
  absl::StatusOr<v1::StepResult> r = absl::InvalidArgumentError("not 'S' and a StepInfo message");
  v1::StepInfo info;
  // 'S' first: a StepInfo of defaults serializes to nothing, and a message may not be empty.
  if (!request.empty() && request[0] == 'S' &&
      info.ParseFromArray(request.data() + 1, static_cast<int>(request.size() - 1))) {
    bool shutting_down;
    {
      absl::MutexLock lock(&mu_);
      shutting_down = shut_down_;
    }
    absl::MutexLock exec(&exec_mu_);
    r = shutting_down ? absl::UnavailableError("worker is shutting down") : StepSharedOnLoop(info);
  }
  // u8 status code (absl's numbering, gRPC's too) | the StepResult, or the error's message.
  std::string reply(1, static_cast<char>(r.status().code()));
  if (r.ok()) {
    reply += r->SerializeAsString();
  } else {
    reply += std::string(r.status().message().substr(0, 4096));
  }
  return reply;
}

absl::StatusOr<v1::RegisterReply> WorkerDaemon::RegisterInProcess(
    const std::vector<ParamTensor>& layout, absl::Span<const float> x0) {
  if (layout.empty() || x0.size() != LayoutNumel(layout)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", x0.size(), " parameters; its layout says ", LayoutNumel(layout)));
  }
  absl::StatusOr<v1::RegisterReply> reply = absl::UnavailableError("worker is shutting down");
  absl::Notification done;
  Post([&](bool cancelled) {
    if (!cancelled) {
      exec_mu_.AssertHeld();  // a job of the loop
      reply = RegisterOnLoop(layout, x0);
    }
    done.Notify();
  });
  done.WaitForNotification();
  return reply;
}

absl::Status WorkerDaemon::BindParamsOnLoop(absl::Span<float> storage) {
  exec_mu_.AssertHeld();  // a job of the loop
  if (!engine_->initialized()) return absl::FailedPreconditionError("register the model first");
  if (shm_ != nullptr) {
    return absl::FailedPreconditionError("the parameters live in a shared-memory segment");
  }
  if (!storage.empty() && storage.size() != engine_->params().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "storage for ", storage.size(), " values; the model has ", engine_->params().size()));
  }
  return engine_->BindParams(storage);
}

absl::Status WorkerDaemon::BindParamsInProcess(absl::Span<float> storage) {
  absl::Status status = absl::UnavailableError("worker is shutting down");
  absl::Notification done;
  Post([&](bool cancelled) {
    if (!cancelled) status = BindParamsOnLoop(storage);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

absl::StatusOr<absl::Span<const float>> WorkerDaemon::StepInProcess(const StepInput& in,
                                                                    StepOutcome* outcome) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("worker is shutting down");
  }
  // On the trainer's own thread, in turn with the round loop's jobs (exec_mu_): a hand-off to
  // the loop thread and back would cost two wake-ups per step.
  absl::MutexLock exec(&exec_mu_);
  if (engine_->initialized() && in.grad.size() != engine_->params().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the gradient has ", in.grad.size(), " values; the model has ", engine_->params().size()));
  }
  TERN_ASSIGN_OR_RETURN(StepOutcome out, StepOnLoop(in));
  if (outcome != nullptr) *outcome = std::move(out);
  return engine_->params();
}

absl::Status WorkerDaemon::BeginStepInProcess(const StepInput& in) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("worker is shutting down");
  }
  absl::MutexLock exec(&exec_mu_);
  if (!engine_->initialized()) return absl::FailedPreconditionError("register the model first");
  if (!transport_->has_peers() && options_.engine.num_workers > 1) {
    return absl::UnavailableError("this worker does not know its peers yet");
  }
  step_begun_ = false;
  TERN_RETURN_IF_ERROR(engine_->BeginStep(in));
  step_begun_ = true;
  return absl::OkStatus();
}

absl::Status WorkerDaemon::GradReadyInProcess(uint64_t from) {
  absl::MutexLock exec(&exec_mu_);
  if (!step_begun_) return absl::FailedPreconditionError("no step begun");
  absl::Status s = engine_->GradReadyFrom(from);
  if (!s.ok()) step_begun_ = false;
  return s;
}

void WorkerDaemon::LogStep(const StepOutcome& out) {
  const absl::Time start = last_step_end_;
  last_step_end_ = absl::Now();
  if (!round_log_.is_open()) return;
  const v1::WorkerStats& d = out.delta;
  v1::StepRecord r;
  r.set_step(static_cast<int32_t>(out.step));
  r.set_lr(out.lr);
  r.set_mixed(static_cast<int32_t>(out.mixed.size()));
  r.set_dropped(static_cast<int32_t>(out.dropped.size()));
  r.set_loss(d.loss_sum());
  r.set_payload_bytes_sent(static_cast<double>(d.payload_bytes_sent()));
  r.set_wire_bytes_sent(static_cast<double>(d.wire_bytes_sent()));
  r.set_payload_bytes_received(static_cast<double>(d.payload_bytes_received()));
  r.set_wire_bytes_received(static_cast<double>(d.wire_bytes_received()));
  r.set_dense_bytes_sent(static_cast<double>(d.dense_bytes_sent()));
  r.set_compute_s(d.compute_seconds());
  r.set_encode_s(d.encode_seconds());
  r.set_wait_s(d.wait_seconds());
  r.set_transfer_s(d.transfer_seconds());
  r.set_combine_s(d.combine_seconds());
  r.set_decode_s(d.decode_seconds());
  r.set_trainer_io_s(d.trainer_io_seconds());
  for (int id : out.mixed) r.add_mixed_ids(id);
  for (int id : out.dropped) r.add_dropped_ids(id);
  r.set_start_unix_s(absl::ToDoubleSeconds(start - absl::UnixEpoch()));
  r.set_end_unix_s(absl::ToDoubleSeconds(last_step_end_ - absl::UnixEpoch()));
  round_log_ << ToJsonLine(r);
  round_log_.flush();  // as it goes: a reader (or a crash) sees every finished step
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
    absl::MutexLock exec(&exec_mu_);
    job(false);
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
  {
    // Stopped outside exec_mu_: its thread may be waiting for it.
    std::unique_ptr<SeqpacketServer> doorbell;
    {
      absl::MutexLock exec(&exec_mu_);
      doorbell = std::move(doorbell_);
    }
    if (doorbell != nullptr) doorbell->Stop();
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  {
    // The model back into the engine's memory before the segment goes (with the daemon).
    absl::MutexLock exec(&exec_mu_);
    if (shm_ != nullptr && engine_->initialized()) (void)engine_->BindParams({});
  }
  if (server_ != nullptr) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    server_->Wait();
  }
  transport_->Drain();
}

}  // namespace tern
