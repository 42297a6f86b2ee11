// The Gossip service of a worker: Gossip.Push (a neighbour's message for a round, whole or one
// stripe of a striped push) and Gossip.Stream (a neighbour's messages one after another, each
// answered on the stream) reassembled and handed to RoundEngine::Deliver, and Gossip.Swap
// (SwarmSGD's model exchange, RoundEngine::HandleSwap), and a rejoining worker's Gossip.Position
// and Gossip.State (RoundEngine::SharedState). Each call is a callback reactor that reads
// its chunks as they come, counted against the worker's StreamLimits; a refusal is a gRPC status
// with its reason, counted once in the engine's stats and logged.
//
// Push and Stream are raw methods: each chunk's data stays in gRPC's slices until the bundle
// parser copies it into place (core/rpc/raw_chunk.h), with no protobuf copy between.
//
// Thread-safety: thread-safe; gRPC calls Push and Swap from its threads. The engine, stream
// limits and codecs it is given must outlive it, and it must outlive the server serving it.
#ifndef TERN_WORKER_GOSSIP_SERVICE_H_
#define TERN_WORKER_GOSSIP_SERVICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/chunking.h"
#include "core/rpc/stream_limits.h"
#include "grpcpp/grpcpp.h"
#include "kernels/payload_scans.h"
#include "kernels/registry.h"
#include "tern/v1/worker.grpc.pb.h"
#include "worker/engine.h"
#include "worker/stripe_join.h"

namespace tern {

struct GossipServiceOptions {
  int worker_id = 0;                                // for the log
  std::string run_id = "tern";                      // what a rejoining worker must ask for
  uint64_t max_bundle_bytes = uint64_t{512} << 20;  // largest message accepted, serialized
  // Who may gossip in (each a name or a prefix ending in '*'); empty: anyone authenticated. With
  // names, each caller's name binds it to one worker id, the number it ends in (worker-3: 3), and
  // it may send as that worker alone.
  std::vector<std::string> peer_names;
  // Runs a job on the round loop, between the trainer's steps (WorkerDaemon::Post): a state
  // asked for is handed over from there when no step comes to publish it (a group done
  // training). Unset: only at a step's end.
  std::function<void(std::function<void(bool cancelled)>)> post;
};

class GossipService final
    : public v1::Gossip::WithCallbackMethod_Position<v1::Gossip::WithCallbackMethod_State<
          v1::Gossip::WithCallbackMethod_Swap<v1::Gossip::WithRawCallbackMethod_Stream<
              v1::Gossip::WithRawCallbackMethod_Push<v1::Gossip::Service>>>>> {
 public:
  GossipService(GossipServiceOptions options, RoundEngine* engine, StreamLimits* limits,
                const CodecRegistry* codecs);

  grpc::ServerReadReactor<grpc::ByteBuffer>* Push(grpc::CallbackServerContext* ctx,
                                                  grpc::ByteBuffer* reply) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Stream(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerBidiReactor<v1::BundleChunk, v1::BundleChunk>* Swap(
      grpc::CallbackServerContext* ctx) override;
  // A rejoining worker's questions: this worker's next step, and the state its group shares
  // (RoundEngine::SharedState).
  grpc::ServerUnaryReactor* Position(grpc::CallbackServerContext* ctx,
                                     const v1::PositionRequest* request,
                                     v1::PositionReply* reply) override;
  grpc::ServerWriteReactor<v1::BundleChunk>* State(grpc::CallbackServerContext* ctx,
                                                   const v1::StateRequest* request) override;

 private:
  class PushCall;
  class StreamCall;
  class SwapCall;
  class StateCall;

  // Caller() and the run id: what a rejoining worker's question must pass.
  absl::Status CheckQuestion(const grpc::ServerContextBase& ctx, const std::string& run_id) const;

  // OK when the call's caller may gossip into this worker (peer_names); PERMISSION_DENIED else.
  absl::Status Caller(const grpc::ServerContextBase& ctx) const;
  // A pushing call's admission: its caller (Caller), then a slot under the stream limits.
  absl::StatusOr<std::unique_ptr<StreamLimits::Stream>> Admit(
      grpc::CallbackServerContext* ctx) const;
  // What a caller of `principal` may send as: PERMISSION_DENIED when `bundle`'s sender is not
  // the worker its name binds it to (under peer_names; anything goes without them).
  absl::Status CheckSender(const std::string& principal, const v1::TensorBundle& bundle) const;
  // Counts and logs a Push refused before its bundle reached the engine.
  void RefusedStream(const absl::Status& s);
  // A pushed bundle (or why there is none) to the engine: what the pusher is answered. A refusal
  // is counted and logged here, once per push however many streams carried it.
  absl::Status DeliverPushed(const std::string& principal, absl::StatusOr<ReceivedBundle> got,
                             uint64_t wire_bytes, PayloadScans* scans);

  const GossipServiceOptions options_;
  RoundEngine* const engine_;
  StreamLimits* const limits_;
  const CodecRegistry* const codecs_;
  StripeJoins joins_;  // outlives every PushCall: the server is gone before this service
};

}  // namespace tern

#endif  // TERN_WORKER_GOSSIP_SERVICE_H_
