// PeerTransport over gRPC: one channel per peer, each push a client-streaming Gossip.Push call
// (callback API) that writes a bundle's chunks in order, with the round's deadline. Pushes are
// written as raw messages (core/rpc/raw_chunk.h): gRPC sends each chunk's data from the bundle's
// own memory, with no protobuf copy of it.
//
// Thread-safety: thread-safe. Send() may be called from any thread; `done` callbacks run on
// gRPC's threads. Drain() before destruction waits for every push still in flight.
#ifndef TERN_WORKER_GRPC_TRANSPORT_H_
#define TERN_WORKER_GRPC_TRANSPORT_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "tern/v1/worker.grpc.pb.h"
#include "worker/engine.h"

namespace tern {

class GrpcTransport final : public PeerTransport {
 public:
  // `credentials` secure the channels to peers (core/rpc/security.h); null is plaintext.
  explicit GrpcTransport(int self, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr)
      : self_(self), credentials_(std::move(credentials)) {}
  ~GrpcTransport() override { Drain(); }

  // Addresses indexed by worker id ("host:port"); the entry for this worker is ignored.
  absl::Status SetPeers(const std::vector<std::string>& addresses);
  bool has_peers() const;

  void Send(int to, Chunks chunks, absl::Time deadline, bool retry_unavailable,
            std::function<void(absl::Status)> done) override;

  absl::StatusOr<v1::TensorBundle> Swap(int to, Chunks chunks, absl::Time deadline) override;

  // Blocks until no push is in flight.
  void Drain();

 private:
  class PushCall;
  void Finished();

  const int self_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  mutable absl::Mutex mu_;
  struct Peer {
    std::unique_ptr<v1::Gossip::Stub> stub;  // Swap
    std::unique_ptr<grpc::GenericStub> raw;  // Push, on the same channel
  };
  std::vector<Peer> peers_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tern

#endif  // TERN_WORKER_GRPC_TRANSPORT_H_
