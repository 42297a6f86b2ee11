// How a worker's engine reaches its peers: gRPC in the daemon (worker/grpc_transport.h),
// in-memory in tests.
//
// Thread-safety: implementations are thread-safe; `done` callbacks run on any thread.
#ifndef TERN_WORKER_PEER_TRANSPORT_H_
#define TERN_WORKER_PEER_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

class PeerTransport {
 public:
  using Chunks = std::shared_ptr<const std::vector<v1::BundleChunk>>;
  virtual ~PeerTransport() = default;
  // Sends one bundle's chunks to worker `to`. With `retry_unavailable`, an unreachable peer is
  // retried with backoff until `deadline` (peers still starting up); otherwise one attempt.
  // `done` runs exactly once, on any thread, with the receiver's verdict.
  virtual void Send(int to, Chunks chunks, absl::Time deadline, bool retry_unavailable,
                    std::function<void(absl::Status)> done) = 0;
  // SwarmSGD: sends our model to `to` and returns its model (blocking, until `deadline`).
  virtual absl::StatusOr<v1::TensorBundle> Swap(int to, Chunks chunks, absl::Time deadline) {
    return absl::UnimplementedError("this transport cannot swap");
  }
  // For a worker rejoining a running run (blocking, until `deadline`): worker `to`'s next step
  // (Gossip.Position; with `back_from` > 0, telling `to` to wait for the asker's messages from
  // that round on), and the state its group shares after a step at or past `min_step`
  // (Gossip.State; Unavailable until it has one).
  struct Position {
    int64_t next_step = 0;
    int64_t rounds_mixed = 0;  // exchanges mixed so far
  };
  virtual absl::StatusOr<Position> AskPosition(int to, const std::string& run_id, int64_t back_from,
                                               absl::Time deadline) {
    return absl::UnimplementedError("this transport cannot ask a peer's position");
  }
  virtual absl::StatusOr<v1::TensorBundle> FetchState(int to, const std::string& run_id,
                                                      int64_t min_step, absl::Time deadline) {
    return absl::UnimplementedError("this transport cannot fetch a peer's state");
  }
};

}  // namespace tern

#endif  // TERN_WORKER_PEER_TRANSPORT_H_
