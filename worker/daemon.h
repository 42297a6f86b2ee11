// The peer daemon: a gRPC server (callback API) with the Gossip (worker/gossip_service.h) and
// Trainer services plus health and reflection, a RoundEngine, and the one thread that runs
// registrations and steps in order.
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
#include <fstream>
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
#include "common/seqpacket_server.h"
#include "common/shared_memory.h"
#include "core/model/layout.h"
#include "core/ops/metrics.h"
#include "core/rpc/security.h"
#include "core/rpc/stream_limits.h"
#include "grpcpp/grpcpp.h"
#include "kernels/registry.h"
#include "tern/v1/worker.pb.h"
#include "worker/engine.h"
#include "worker/grpc_transport.h"

namespace tern {

class GossipService;  // worker/gossip_service.h

// What Trainer.Step answers for a step's outcome.
v1::StepResult StepResultOf(const StepOutcome& out);

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
  absl::Status SetPeers(const std::vector<std::string>& addresses);
  // Whether it can train: a model registered and, with neighbours, their addresses known. Its
  // health service says NOT_SERVING (the whole server and tern.v1.Gossip) until then.
  bool ready();
  // A channel to this daemon that skips the network.
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // A trainer in this process (the built-in one): what Trainer.Register and Trainer.Step do, in
  // turn with the other calls (a step runs on the caller's thread while the round loop waits),
  // with no serialization and no copy. They block until done; Unavailable once Shutdown() began.
  absl::StatusOr<v1::RegisterReply> RegisterInProcess(const std::vector<ParamTensor>& layout,
                                                      absl::Span<const float> x0);
  // Runs a step with `in.grad` (read in place) and returns a view of the parameters after it,
  // valid and unchanged until the next step; `outcome` (may be null) gets what the step did.
  absl::StatusOr<absl::Span<const float>> StepInProcess(const StepInput& in, StepOutcome* outcome);
  // The same step in parts (RoundEngine::BeginStep): BeginStepInProcess before the backward pass
  // (`in.step`, `in.grad`: the buffer it writes), GradReadyInProcess(from) as it finishes
  // grad[from, end) (the buckets inside start their rounds), then StepInProcess finishes it.
  absl::Status BeginStepInProcess(const StepInput& in);
  absl::Status GradReadyInProcess(uint64_t from);
  // Moves the parameters into `storage` (as many floats as the model; the caller's, outliving
  // the binding) or back into the engine's memory with an empty span: every later step writes
  // them there, so a trainer in this process reads them in place. After RegisterInProcess; not
  // while a shared-memory segment holds them.
  absl::Status BindParamsInProcess(absl::Span<float> storage);
  RoundEngine* engine() { return engine_.get(); }

  // Stops accepting calls, lets running ones finish for up to `grace`, then cancels the rest.
  void Shutdown(absl::Duration grace);

  // Runs `job(false)` on the round-loop thread, after every job queued before it; after
  // Shutdown() began, runs `job(true)` on the caller's thread instead (the job reports
  // Unavailable).
  void Post(std::function<void(bool cancelled)> job);

 private:
  class TrainerService;
  WorkerDaemon(DaemonOptions options, const CodecRegistry* codecs,
               std::unique_ptr<GrpcTransport> transport, std::unique_ptr<RoundEngine> engine);
  void LoopThread();
  // Under exec_mu_: on the round-loop thread (a posted job), or on a trainer's thread in turn
  // with it.
  absl::StatusOr<v1::RegisterReply> RegisterOnLoop(const std::vector<ParamTensor>& layout,
                                                   absl::Span<const float> x0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_);
  absl::StatusOr<StepOutcome> StepOnLoop(const StepInput& in)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_);
  absl::StatusOr<v1::SharedMemoryInfo> OpenSharedOnLoop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_);
  // A job of the loop (asserts exec_mu_ held).
  absl::Status BindParamsOnLoop(absl::Span<float> storage);
  absl::StatusOr<v1::StepResult> StepSharedOnLoop(const v1::StepInfo& info)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_);
  // The doorbell's handler: 'S' and a StepInfo in; a status byte and a StepResult (or the
  // error's message) out.
  std::string DoorbellStep(absl::string_view request) ABSL_LOCKS_EXCLUDED(exec_mu_);
  void LogStep(const StepOutcome& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(exec_mu_);
  // Sets the health status from ready().
  void UpdateHealth();

  const DaemonOptions options_;
  const CodecRegistry* const codecs_;
  const std::unique_ptr<GrpcTransport> transport_;  // outlives engine_ (destroyed after it)
  const std::unique_ptr<RoundEngine> engine_;
  const std::unique_ptr<StreamLimits> limits_;  // outlives server_ and its reactors
  std::unique_ptr<GossipService> gossip_;
  std::unique_ptr<TrainerService> trainer_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<CallAuthenticator> authenticator_;  // null when calls are not authenticated
  int port_ = 0;
  std::unique_ptr<MetricsEndpoint> metrics_;  // stopped first: it reads engine_

  absl::Mutex mu_;
  std::deque<std::function<void(bool)>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread loop_;
  // Held while a job of the round loop runs, and while a trainer in this process or the doorbell
  // runs a step: the engine's steps and the members below are used by one of them at a time.
  absl::Mutex exec_mu_;
  // BeginStepInProcess opened the engine's step.
  bool step_begun_ ABSL_GUARDED_BY(exec_mu_) = false;
  std::ofstream round_log_ ABSL_GUARDED_BY(exec_mu_);
  absl::Time last_step_end_ ABSL_GUARDED_BY(exec_mu_) = absl::InfinitePast();
  // The trainer's, once it asked (OpenSharedMemory).
  std::unique_ptr<SharedSegment> shm_ ABSL_GUARDED_BY(exec_mu_);
  // Where the trainer writes the gradient; the model follows it.
  size_t shm_grad_at_ ABSL_GUARDED_BY(exec_mu_) = 0;
  int shm_serial_ ABSL_GUARDED_BY(exec_mu_) = 0;
  // The trainer's doorbell (a Unix socket beside the segment), made at its first OpenSharedMemory.
  std::unique_ptr<SeqpacketServer> doorbell_ ABSL_GUARDED_BY(exec_mu_);
};

}  // namespace tern

#endif  // TERN_WORKER_DAEMON_H_
