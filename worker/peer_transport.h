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
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// A rejoining worker's answer to a message for a round it sits out (its state covers it, or it
// sends nothing there): UNAVAILABLE, so the sender does not wait for its message in that round,
// and final, so a push that retries a peer still starting up does not try it again.
inline absl::Status SitsOutError(int worker, int64_t round) {
  return absl::UnavailableError(
      absl::StrCat("worker ", worker, " is rejoining the run and sits round ", round, " out"));
}
inline bool IsSitOut(const absl::Status& s) {
  return absl::IsUnavailable(s) &&
         absl::StrContains(s.message(), " is rejoining the run and sits round ");
}

class PeerTransport {
 public:
  using Chunks = std::shared_ptr<const std::vector<v1::BundleChunk>>;
  virtual ~PeerTransport() = default;
  // How hard a push tries to reach its peer.
  enum class Reach {
    kOnce,  // one attempt: an unreachable peer fails it at once
    // Unavailable is tried again, with backoff, until the deadline: a peer still starting up.
    kRetryUnavailable,
    // One attempt that waits for a connection until the deadline: a peer that said it is back
    // (it listens; a connection to it may still be backing off). Its own answer is final, even
    // Unavailable (a rejoining worker sitting a round out has the message already).
    kWaitForReady,
  };
  // Sends one bundle's chunks to worker `to`, reaching it as `reach` says. `done` runs exactly
  // once, on any thread, with the receiver's verdict.
  virtual void Send(int to, Chunks chunks, absl::Time deadline, Reach reach,
                    std::function<void(absl::Status)> done) = 0;
  // Worker `to` said it is back (a restarted worker rejoining): a transport that backs off
  // reconnecting to a peer it could not reach tries it again now, not after the backoff.
  virtual void Reconnect(int to) {}
  // SwarmSGD: sends our model to `to` and returns its model (blocking, until `deadline`).
  virtual absl::StatusOr<v1::TensorBundle> Swap(int to, Chunks chunks, absl::Time deadline) {
    return absl::UnimplementedError("this transport cannot swap");
  }
  // For a worker rejoining a running run (blocking, until `deadline`): worker `to`'s next step
  // (Gossip.Position; with `back_from` > 0, telling `to` to wait for the asker's messages from
  // that round on), and slice `slice` of `slices` of the state it hands over after a step at or
  // past `min_step` (Gossip.State; Unavailable until it has one; slices 1: the whole).
  struct Position {
    int64_t next_step = 0;
    int64_t rounds_mixed = 0;  // exchanges mixed so far
  };
  virtual absl::StatusOr<Position> AskPosition(int to, const std::string& run_id, int64_t back_from,
                                               absl::Time deadline) {
    return absl::UnimplementedError("this transport cannot ask a peer's position");
  }
  virtual absl::StatusOr<v1::TensorBundle> FetchState(int to, const std::string& run_id,
                                                      int64_t min_step, uint32_t slice,
                                                      uint32_t slices, absl::Time deadline) {
    return absl::UnimplementedError("this transport cannot fetch a peer's state");
  }
};

}  // namespace tern

#endif  // TERN_WORKER_PEER_TRANSPORT_H_
