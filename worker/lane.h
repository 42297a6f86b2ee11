// One bucket of a worker's model (the whole model when there are no buckets) and its rounds with
// the neighbours: its own algorithm instance over its range of the parameters, its inbox, the
// round pushed and not yet mixed, and its probe state (one push at a time to a neighbour that is
// down). Push sends a round's message to the neighbours; Finish waits for theirs to the round's
// deadline, judges each neighbour (PeerHealth) and mixes. The engine (worker/engine.h) makes the
// lanes, prepares each round's message and counts what a round reports.
//
// Thread-safety: a Lane and PeerHealth are used by the engine's step thread only; a round's
// pushes are shared with the transport's callbacks under their own lock, and the inbox is
// thread-safe.
#ifndef TERN_WORKER_LANE_H_
#define TERN_WORKER_LANE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/topology/topology.h"
#include "worker/algorithm.h"
#include "worker/fragments.h"
#include "worker/gossip_inbox.h"
#include "worker/peer_transport.h"

namespace tern {

// Transport-level failures: the peer did not get the message (dead, unreachable, too slow).
bool PeerUnreachable(const absl::Status& s);

// Which neighbours are worth waiting for (reachable and in step) and which were ever heard from,
// across every lane; judged from each round's pushes and messages.
class PeerHealth {
 public:
  explicit PeerHealth(int num_workers)
      : up_(num_workers, true), heard_(num_workers, false), returning_(num_workers, false) {}

  bool up(int j) const { return up_[static_cast<size_t>(j)]; }
  // `j` said it is alive (a rejoining worker, from its first round on): waited for again, as
  // after a push that got through.
  void MarkUp(int j) { up_[static_cast<size_t>(j)] = true; }
  // `j` is new to a running run (a joiner): not waited for until it says it sends (MarkUp) or a
  // message of its comes, and pushed to once a round, as a peer heard from before: the state it
  // takes covers the rounds whose pushes it refused (a push retried to the round's deadline
  // would hold back the next rounds' pushes, which it needs).
  void Joining(int j) {
    up_[static_cast<size_t>(j)] = false;
    heard_[static_cast<size_t>(j)] = true;
  }
  // `j` said it listens (a worker rejoining): if heard from before, pushes to it wait for a
  // connection (ours may still be backing off from while it was down) until its next message.
  // One never heard from is starting up: its pushes go on retrying Unavailable (its model may
  // not be registered yet).
  void Returning(int j) {
    const size_t at = static_cast<size_t>(j);
    if (heard_[at]) returning_[at] = true;
  }
  bool heard(int j) const { return heard_[static_cast<size_t>(j)]; }  // ever
  // How a push reaches `j`: retried while it was never heard from (starting up), waiting for a
  // connection while it is coming back, else once.
  PeerTransport::Reach ReachOf(int j) const {
    const size_t at = static_cast<size_t>(j);
    if (returning_[at]) return PeerTransport::Reach::kWaitForReady;
    return heard_[at] ? PeerTransport::Reach::kOnce : PeerTransport::Reach::kRetryUnavailable;
  }
  // Marks each of `nbrs` up or down from its push's verdict (`results`; none: still running) and
  // whether its message came (`received`); appends it to `mixed` or `dropped` and counts the
  // pushes accepted in `sent_to`. Logs each change, as worker `me` in round `step`. Without
  // `pushed` (a round this worker sat out: no pushes) only the messages count. Without
  // `deadline_passed` the wait for the missing messages ended early (the sender was replaced,
  // its push failed, or it went on past the round), and the log says so.
  void Judge(int me, int64_t step, const std::vector<int>& nbrs,
             const std::map<int, absl::Status>& results,
             const std::map<int, GossipMessage>& received, uint64_t* sent_to,
             std::vector<int>* mixed, std::vector<int>* dropped, bool pushed = true,
             bool deadline_passed = true);

 private:
  std::vector<bool> up_;
  std::vector<bool> heard_;
  std::vector<bool> returning_;
};

// The pushes of one round, shared with their callbacks, which may finish after the round gave up
// on them.
struct RoundPushes {
  absl::Mutex mu;
  // The round waits for the pushes to neighbours that were up; one to a neighbour that is down
  // may hang to its deadline (a partition) and is not waited for.
  std::set<int> awaited ABSL_GUARDED_BY(mu);
  // Each push's verdict and when it came: with `sent`, the link as this worker's messages see it.
  struct Ended {
    absl::Status status;
    absl::Time at;
  };
  std::map<int, Ended> ended ABSL_GUARDED_BY(mu);
  absl::Time sent;  // when the pushes went out
  bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (int j : awaited) {
      if (!ended.count(j)) return false;
    }
    return true;
  }
  bool Finished(int j) {
    absl::MutexLock lock(&mu);
    return ended.count(j) != 0;
  }
};

// A round whose message is out: its neighbours, weights, pushes and what it counts as.
struct InFlight {
  int64_t step = 0;
  std::vector<int> nbrs;
  MixingRow row;
  std::shared_ptr<RoundPushes> pushes;
  uint64_t payload = 0, dense = 0, wire = 0;  // one message's bytes
  absl::Time deadline;
  // A push to a rejoining neighbour's (Lane::Push): past `deadline`, as nobody waits for it.
  absl::Time lasting_deadline;
  // This worker sent nothing and mixes the others' messages alone (a rejoined worker, until its
  // peers wait for it: RoundEngine::Rejoin).
  bool sat_out = false;
  // diloco: the CRC-32 of this worker's group model θ as it pushed (GossipMessage::group_crc).
  std::optional<uint32_t> group_crc;
};

// What a finished round did, for the engine's counters.
struct RoundReport {
  std::vector<int> mixed, dropped;
  // Neighbours whose message said a group model θ other than this worker's.
  std::vector<int> group_mismatch;
  // The CRC of θ each message heard said (diloco).
  std::map<int, uint32_t> group_crcs;
  std::map<int, absl::Status> results;  // each neighbour's push
  uint64_t sent_to = 0;                 // pushes accepted
  double wait_seconds = 0;              // for the neighbours' messages
  double transfer_seconds = 0;          // for our pushes, after the messages
  // From the pushes' start to the last one's end, when every push awaited got through (else 0).
  double push_seconds = 0;
  absl::Time combine_started;  // the mixing's start (its time, less decoding, counts)
};

struct Lane {
  // Pushes round `r`'s message (`chunks`) to its neighbours at once, waiting (in Finish) for
  // those `health` says are up. A push that fails for transport reasons stops the wait for that
  // neighbour's message too (it is gone). A neighbour that is down and still has a push of an
  // earlier round under way is not pushed to again (nor waited for) until that one ends. One
  // rejoining (PeerHealth::ReachOf: waiting for a connection) mixes these rounds later, from its
  // inbox, while its state comes over the same link: its push has until `r.lasting_deadline`
  // (nobody waits for it past the round's), and it gets the next rounds' too, two in flight, and
  // later those past two, once earlier ones ended (held: in order, the newest kMaxHeld, each
  // until its deadline).
  void Push(InFlight& r, const PeerTransport::Chunks& chunks, const PeerHealth& health,
            PeerTransport* transport);
  // Waits for round `r`'s messages (from the neighbours up, to its deadline) and pushes, judges
  // the neighbours, and mixes what came. A Combine that fails (unexpected: messages are checked
  // on arrival) keeps the local model and drops every neighbour.
  absl::StatusOr<RoundReport> Finish(InFlight r, int me, PeerHealth& health);

  // Whether the lane's values are several runs of the model (strided fragments): its algorithm
  // then holds them gathered in a vector of its own, which Scatter copies back into the model.
  bool gathered() const { return pieces.size() > 1; }
  // The lane's values of `whole` (the model, or a gradient over it): a view when it is one run,
  // else gathered into `*into`.
  absl::Span<const float> Gather(absl::Span<const float> whole, std::vector<float>* into) const;
  // The algorithm's values into their places in `whole` (the model).
  void Scatter(absl::Span<float> whole) const;
  // `mine` (the lane's values in its order: size of them) into their places in `whole`.
  void Place(absl::Span<const float> mine, absl::Span<float> whole) const;

  std::unique_ptr<Algorithm> algorithm;
  std::shared_ptr<GossipInbox> inbox;  // shared with push callbacks
  // Its runs of the parameter vector (ascending); `offset` is the first one's start, `size` all
  // of their values.
  std::vector<Piece> pieces;
  uint64_t offset = 0, size = 0;
  std::vector<TensorBlock> blocks;  // the model's tensors in it (its algorithm's Init)
  std::vector<float> grad;          // gathered: this step's gradient of its values
  // Each neighbour's latest push's round: a neighbour that is down gets one push at a time (a
  // probe; behind a partition each would hang to its deadline).
  std::vector<std::shared_ptr<RoundPushes>> last_push;
  std::vector<std::shared_ptr<RoundPushes>> push_before;  // each neighbour's one before the latest
  // A round's push to a neighbour rejoining, made once the ones before it end. Dropped, it was
  // lost to a joiner whose state is from before that round (the two before it, which it refused
  // while it asked where the group is, had not ended: slow under load): its θ missed that update
  // and split from the group's.
  struct HeldPush {
    int64_t step = 0;
    PeerTransport::Chunks chunks;
    absl::Time deadline, lasting_deadline;
    std::shared_ptr<RoundPushes> pushes;
  };
  // Rounds held to each neighbour, oldest first: the newest few (each a message kept alive; a
  // joiner's state covers the older ones).
  static constexpr size_t kMaxHeld = 4;
  std::vector<std::deque<HeldPush>> held;

  std::optional<InFlight> round;  // pushed, not mixed yet (with overlap: until the next step)
  bool started = false;           // this step's local update and push are done

  // Push's parts. Whether a push to `j` may go now: at once to a neighbour up, else one at a time
  // (two to one rejoining).
  bool Room(int j, const PeerHealth& health) const;
  // Sends `j`'s held pushes while there is room, dropping those past their deadline.
  void SendHeld(int j, const PeerHealth& health, PeerTransport* transport);
  void Send(int j, int64_t step, const PeerTransport::Chunks& chunks, absl::Time deadline,
            absl::Time lasting_deadline, const std::shared_ptr<RoundPushes>& pushes,
            const PeerHealth& health, PeerTransport* transport);
};

}  // namespace tern

#endif  // TERN_WORKER_LANE_H_
