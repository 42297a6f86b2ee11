// How a worker's engine reaches its peers: gRPC in the daemon (worker/grpc_transport.h),
// in-memory in tests.
//
// Thread-safety: implementations are thread-safe; `done` callbacks run on any thread.
#ifndef TERN_WORKER_PEER_TRANSPORT_H_
#define TERN_WORKER_PEER_TRANSPORT_H_

#include <functional>
#include <memory>
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
};

}  // namespace tern

#endif  // TERN_WORKER_PEER_TRANSPORT_H_
