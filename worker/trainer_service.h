// The gRPC Trainer service of a worker: a trainer in another process registers its model and
// steps over gRPC (Register, Step: the tensors as chunked bundles), or through shared memory
// (OpenSharedMemory, StepShared: worker/trainer_segment.h); Snapshot and Stats answer at once. An
// adapter over TrainerPort: calls that run the engine are posted to the worker's round loop (a step
// may wait for the round's deadline; gRPC's threads must not), as jobs under the port's lock.
//
// Thread-safety: thread-safe; gRPC calls it from its threads. What it is given must outlive it,
// and it must outlive the server serving it.
#ifndef TERN_WORKER_TRAINER_SERVICE_H_
#define TERN_WORKER_TRAINER_SERVICE_H_

#include <cstdint>
#include <functional>

#include "grpcpp/grpcpp.h"
#include "kernels/registry.h"
#include "tern/v1/worker.grpc.pb.h"
#include "worker/engine.h"
#include "worker/trainer_port.h"
#include "worker/trainer_segment.h"

namespace tern {

struct TrainerServiceOptions {
  uint64_t max_bundle_bytes = uint64_t{512} << 20;  // largest registration or gradient, serialized
  uint64_t max_params = uint64_t{1} << 28;          // largest model a trainer may register
  // Who may call it (each a name or a prefix ending in '*', "*" anyone); empty: callers on this
  // host's loopback or a Unix socket alone. A trainer is one process beside its worker: nobody
  // else steps it, reads its model or its counters.
  std::vector<std::string> trainer_names;
  // Runs `job(false)` on the round loop under the port's lock, or `job(true)` at once when the
  // worker is shutting down (WorkerDaemon::Post).
  std::function<void(std::function<void(bool cancelled)> job)> post;
};

class TrainerService final : public v1::Trainer::CallbackService {
 public:
  TrainerService(TrainerServiceOptions options, TrainerPort* port, TrainerSegment* segment,
                 RoundEngine* engine, const CodecRegistry* codecs)
      : options_(std::move(options)),
        port_(port),
        segment_(segment),
        engine_(engine),
        codecs_(codecs) {}

  grpc::ServerReadReactor<v1::RegisterRequest>* Register(grpc::CallbackServerContext* ctx,
                                                         v1::RegisterReply* reply) override;
  grpc::ServerBidiReactor<v1::StepRequest, v1::StepReply>* Step(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerWriteReactor<v1::SnapshotReply>* Snapshot(
      grpc::CallbackServerContext* ctx, const v1::SnapshotRequest* request) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const v1::StatsRequest*,
                                  v1::WorkerStats* reply) override;
  grpc::ServerUnaryReactor* OpenSharedMemory(grpc::CallbackServerContext* ctx,
                                             const v1::OpenSharedMemoryRequest*,
                                             v1::SharedMemoryInfo* reply) override;
  grpc::ServerUnaryReactor* StepShared(grpc::CallbackServerContext* ctx,
                                       const v1::StepInfo* request, v1::StepResult* reply) override;

 private:
  // OK when the call's caller may use this service (trainer_names); PERMISSION_DENIED else.
  absl::Status Caller(const grpc::CallbackServerContext& ctx) const;

  class RegisterCall;
  class StepCall;
  class SnapshotCall;

  const TrainerServiceOptions options_;
  TrainerPort* const port_;
  TrainerSegment* const segment_;
  RoundEngine* const engine_;
  const CodecRegistry* const codecs_;
};

}  // namespace tern

#endif  // TERN_WORKER_TRAINER_SERVICE_H_
