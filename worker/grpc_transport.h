// PeerTransport over gRPC: one channel per peer. A message goes, after the ones before it, on a
// long-lived Gossip.Stream to its peer, which answers each in turn: it costs no call of its own
// (on loopback a small message takes half the time and CPU a call took; docs/wire-format.md,
// "Push streams"). A message the stream cannot take (one striped, one waiting for a returning
// peer) goes as a client-streaming Gossip.Push call of its own, as does one still unanswered
// when its stream ends (the peer restarted, the connection broke): the Push brings the verdict.
// Messages are written as raw messages (core/rpc/raw_chunk.h): gRPC sends each chunk's data
// from the bundle's own memory, with no protobuf copy of it. A large bundle is striped: its
// chunks go over several Push streams at once, each on a connection of its own to the peer
// (docs/wire-format.md, "Striped pushes"), since one HTTP/2 connection moves bytes at well under
// a socket's speed.
//
// Thread-safety: thread-safe. Send() may be called from any thread; `done` callbacks run on
// gRPC's threads. Drain() before destruction waits for every message still in flight and ends
// the streams.
#ifndef TERN_WORKER_GRPC_TRANSPORT_H_
#define TERN_WORKER_GRPC_TRANSPORT_H_

#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "tern/v1/worker.grpc.pb.h"
#include "worker/engine.h"

namespace tern {

// How pushes are spread over connections and streams.
struct PushStriping {
  int stripes = 2;                         // streams (and connections) per large push; 1: none
  uint64_t min_bytes = uint64_t{8} << 20;  // bundles smaller than this go as one stream
  // Messages not striped go on one long-lived Gossip.Stream per peer (--push_streams); false:
  // a Push call each.
  bool streams = true;
  // How long a stream takes new messages; once idle after that it closes, and the next message
  // opens another. Under the receiver's --stream_idle_s, so it is not cut while waiting.
  absl::Duration stream_life = absl::Seconds(30);
};

class GrpcTransport final : public PeerTransport {
 public:
  // `credentials` secure the channels to peers (core/rpc/security.h); null is plaintext.
  explicit GrpcTransport(int self, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
                         PushStriping striping = {})
      : self_(self), credentials_(std::move(credentials)), striping_(striping) {}
  ~GrpcTransport() override { Drain(); }

  // Addresses indexed by worker id ("host:port"); the entry for this worker is ignored. With
  // `absent_ok` an empty one is a worker not there yet (calls to it fail until SetPeer).
  absl::Status SetPeers(const std::vector<std::string>& addresses, bool absent_ok = false);
  // Worker `to` is now at `address` (it came back elsewhere): calls from now on go there. True
  // when it moved; false, and nothing done, when the address is the one known;
  // FailedPrecondition before SetPeers.
  absl::StatusOr<bool> SetPeer(int to, const std::string& address);
  bool has_peers() const;

  void Send(int to, Chunks chunks, absl::Time deadline, Reach reach,
            std::function<void(absl::Status)> done) override;

  // Resets the reconnect backoff of every channel to `to`.
  void Reconnect(int to) override;
  absl::StatusOr<v1::TensorBundle> Swap(int to, Chunks chunks, absl::Time deadline) override;
  absl::StatusOr<Position> AskPosition(int to, const std::string& run_id, int64_t back_from,
                                       absl::Time deadline) override;
  absl::StatusOr<v1::TensorBundle> FetchState(int to, const std::string& run_id, int64_t min_step,
                                              uint32_t slice, uint32_t slices,
                                              absl::Time deadline) override;

  // Blocks until no message is in flight, then ends the streams to peers (messages sent after
  // go as Push calls).
  void Drain();

  // Streams to peers opened so far (for tests).
  int streams_opened() const;

 private:
  class Push;
  class PushCall;
  class PeerStream;
  struct Message;
  // Sends `m` as a Push call of its own (already counted in flight), `after` from now.
  void SendAsPush(int to, Message m, absl::Duration after = absl::ZeroDuration());
  // The stream to `to` that takes a message now: the open one, or a new one (then `fresh` is
  // it, to start, and `closing` the one it replaces, to close), or null (no streams to `to`).
  std::shared_ptr<PeerStream> StreamFor(int to, std::shared_ptr<PeerStream>* fresh,
                                        std::shared_ptr<PeerStream>* closing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stream's call ended with `status`: it takes no more messages.
  void StreamEnded(int to, const PeerStream* stream, const absl::Status& status);
  // A stream was freed.
  void StreamGone();
  void Finished();
  uint64_t NewStreamId();
  // Peer `to`'s Gossip stub, or FailedPrecondition when its address is not known.
  absl::StatusOr<v1::Gossip::Stub*> StubOf(int to) const;
  struct Peer;
  Peer MakePeer(const std::string& address) const;

  const int self_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const PushStriping striping_;
  mutable absl::Mutex mu_;
  struct Peer {
    std::unique_ptr<v1::Gossip::Stub> stub;  // Swap
    // Push: [0] on the same channel as `stub`, the others each on a connection of its own.
    std::vector<std::unique_ptr<grpc::GenericStub>> raw;
    std::vector<std::shared_ptr<grpc::Channel>> channels;  // those of `raw`, for Reconnect
    std::string address;
    // The stream taking messages (on raw[0]); it holds itself while its call runs.
    std::weak_ptr<PeerStream> stream;
    bool no_streams = false;  // the peer does not serve Gossip.Stream: pushes only
  };
  std::vector<Peer> peers_ ABSL_GUARDED_BY(mu_);
  // Peers' stubs replaced by SetPeer, kept to the end: a call in flight may still use them.
  std::vector<Peer> replaced_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // messages
  int streams_ ABSL_GUARDED_BY(mu_) = 0;    // PeerStreams not yet freed
  int streams_opened_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;                        // Drain ran: pushes only
  std::vector<std::weak_ptr<PeerStream>> live_ ABSL_GUARDED_BY(mu_);  // for Drain to end
  std::mt19937_64 stream_ids_ ABSL_GUARDED_BY(mu_){std::random_device()()};
};

}  // namespace tern

#endif  // TERN_WORKER_GRPC_TRANSPORT_H_
