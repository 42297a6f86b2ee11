// The peer daemon: a RoundEngine; the door a trainer's steps enter by (worker/trainer_port.h),
// with its adapters, the Trainer service (worker/trainer_service.h) and the shared segment
// (worker/trainer_segment.h); the Gossip service (worker/gossip_service.h); a gRPC server
// (callback API) with those services plus health and reflection; and the round loop, the one
// thread that runs the Trainer service's registrations and steps in order. This file: start,
// shutdown and the loop.
//
//   auto d = WorkerDaemon::Start(options, registries);   // binds, serves
//   d->SetPeers(addresses);                          // before the first step
//   ... a trainer drives it over d->InProcessChannel() or the network ...
//   d->Shutdown(absl::Seconds(5));                   // graceful
//
// Thread-safety: thread-safe. Shutdown() may be called from any thread, once.
#ifndef TERN_WORKER_DAEMON_H_
#define TERN_WORKER_DAEMON_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/model/layout.h"
#include "core/ops/metrics.h"
#include "core/rpc/security.h"
#include "core/rpc/stream_limits.h"
#include "grpcpp/grpcpp.h"
#include "kernels/registry.h"
#include "tern/v1/worker.pb.h"
#include "worker/engine.h"
#include "worker/grpc_transport.h"
#include "worker/trainer_port.h"
#include "worker/trainer_segment.h"

namespace tern {

class GossipService;   // worker/gossip_service.h
class TrainerService;  // worker/trainer_service.h

struct DaemonOptions {
  std::string listen = "127.0.0.1:0";  // port 0: pick a free one (see port())
  EngineOptions engine;
  // Largest bundle (gossip message, gradient, registration) accepted, serialized.
  uint64_t max_bundle_bytes = uint64_t{512} << 20;
  // When set, one JSON line per step: its bytes (payload, wire, dense) and time split.
  std::string round_log;
  // Incoming Gossip.Push / Swap streams: counts, idle and total time, and the bytes they may
  // buffer together; max_buffered_bytes 0 = sized for the model (kAutoBufferedModels × its bytes,
  // at least 64 MiB; 64 MiB until a model is registered).
  StreamLimitOptions limits{.max_buffered_bytes = 0};
  // "HOST:PORT" of a Prometheus /metrics endpoint (worker/metrics.h); "" = none.
  std::string metrics_listen;
  // TLS for the gRPC port and the channels to peers (core/rpc/security.h): with a CA, peers
  // must present certificates it signed (mutual TLS), or tokens from tls.tokens.
  TlsFiles tls;
  // Who may gossip into this worker (Gossip.Push, Swap): the names calls are authenticated as
  // (core/rpc/auth.h), each a name or a prefix ending in '*' ("worker-*"); empty: anyone the
  // server authenticates. Clients of the run's aggregator hold certificates of the same CA:
  // this keeps them out of the gossip.
  std::vector<std::string> peer_names;
  // Who may call its Trainer service (Register, Step, Snapshot, Stats, the shared segment's
  // calls): names as peer_names, "*" anyone; empty: callers on this host alone.
  std::vector<std::string> trainer_names;
  // How this worker's pushes to its peers spread over connections (--push_stripes).
  PushStriping striping;
};

// With an automatic budget, incoming streams may buffer this many models' worth of bytes.
inline constexpr uint64_t kAutoBufferedModels = 8;

class WorkerDaemon {
 public:
  // `registries` must outlive the daemon.
  static absl::StatusOr<std::unique_ptr<WorkerDaemon>> Start(DaemonOptions options,
                                                             const WorkerRegistries* registries);
  ~WorkerDaemon();

  int port() const { return port_; }
  // The /metrics endpoint's port, or 0 without one.
  int metrics_port() const { return metrics_ == nullptr ? 0 : metrics_->port(); }
  // `absent_ok`: an empty address is an id with no member yet (an elastic run), set later by
  // SetPeer; otherwise every peer needs one.
  absl::Status SetPeers(const std::vector<std::string>& addresses, bool absent_ok = false);
  // Peer `id` is now at `address` (a worker whose peers come from the scheduler follows one that
  // came back elsewhere), and the rounds under way stop waiting for the process that was there
  // (RoundEngine::PeerReplaced); nothing done when it is where it was.
  absl::Status SetPeer(int id, const std::string& address);
  // Whether it can train: a model registered and, with neighbours, their addresses known. Its
  // health service says NOT_SERVING (the whole server and tern.v1.Gossip) until then.
  bool ready();
  // A channel to this daemon that skips the network.
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // Where a trainer's step enters (worker/trainer_port.h): a trainer in this process (the
  // built-in one, the embedded PyTorch worker) calls it directly, with no serialization and no
  // copy; the Trainer service and the shared segment are adapters over it.
  TrainerPort& trainer() { return *trainer_port_; }
  RoundEngine* engine() { return engine_.get(); }

  // Stops accepting calls, lets running ones finish for up to `grace`, then cancels the rest.
  void Shutdown(absl::Duration grace);

  // Runs `job(false)` on the round-loop thread, after every job queued before it, under the
  // trainer port's lock (in turn with every step); after Shutdown() began, runs `job(true)` on
  // the caller's thread instead (the job reports Unavailable).
  void Post(std::function<void(bool cancelled)> job);

 private:
  WorkerDaemon(DaemonOptions options, const CodecRegistry* codecs,
               std::unique_ptr<GrpcTransport> transport, std::unique_ptr<RoundEngine> engine);
  void LoopThread();
  // A model of `num_params` values was registered: sizes the stream budget, says SERVING.
  void Registered(uint64_t num_params);
  // Sets the health status from ready().
  void UpdateHealth();

  const DaemonOptions options_;
  const CodecRegistry* const codecs_;
  const std::unique_ptr<GrpcTransport> transport_;  // outlives engine_ (destroyed after it)
  const std::unique_ptr<RoundEngine> engine_;
  const std::unique_ptr<StreamLimits> limits_;  // outlives server_ and its reactors
  const std::unique_ptr<TrainerPort> trainer_port_;
  const std::unique_ptr<TrainerSegment> segment_;  // closed before the port goes
  std::unique_ptr<GossipService> gossip_;
  std::unique_ptr<TrainerService> trainer_service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<CallAuthenticator> authenticator_;  // null when calls are not authenticated
  int port_ = 0;
  std::unique_ptr<MetricsEndpoint> metrics_;  // stopped first: it reads engine_

  absl::Mutex mu_;
  std::deque<std::function<void(bool)>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread loop_;  // runs jobs_ in order, each under the trainer port's lock
};

}  // namespace tern

#endif  // TERN_WORKER_DAEMON_H_
