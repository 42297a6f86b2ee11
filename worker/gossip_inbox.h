// Neighbours' gossip messages waiting for the round loop, keyed by (round, sender).
//
// Messages may arrive before this worker reaches their round (a neighbour that is ahead), so the
// inbox holds a bounded window of future rounds; a message for a round already closed, too far
// ahead, or a second one from the same sender for a round is refused with an error the sender
// sees. Take() closes a round: it waits for the listed senders up to a deadline, hands over what
// arrived, and from then on refuses that round.
//
// Thread-safety: thread-safe. Put() is called from RPC threads, Take() from the round loop.
#ifndef TERN_WORKER_GOSSIP_INBOX_H_
#define TERN_WORKER_GOSSIP_INBOX_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/algorithm.h"

namespace tern {

class GossipInbox {
 public:
  // Rounds in [floor, floor + max_rounds_ahead × steps_per_round) are accepted; floor starts at
  // 0. Rounds are numbered by step: an algorithm that talks every H steps (local SGD, diloco)
  // has its window, and kPassedBy, H times as many steps wide, or a neighbour one long period
  // ahead would have its message refused (and diloco's shared state split).
  explicit GossipInbox(int64_t max_rounds_ahead, int64_t steps_per_round = 1)
      : max_ahead_(max_rounds_ahead * std::max<int64_t>(1, steps_per_round)),
        passed_by_(kPassedBy * std::max<int64_t>(1, steps_per_round)) {}

  // Stores `msg` from `sender` for `round`. OutOfRange for a closed or too-distant round,
  // AlreadyExists for a duplicate, Cancelled after Close(). Either way `round` tells how far
  // the sender has come: Take stops waiting for a sender seen kPassedBy or more rounds past the
  // round it takes (below).
  absl::Status Put(int64_t round, int sender, GossipMessage msg);

  // The error Put would give for `round` (closed, too far ahead, shutting down), or OK.
  absl::Status CheckRound(int64_t round) const;
  // Notes, as Put does, that `sender` has come as far as `round` (a checked message of a round
  // too far ahead to keep). Like a message Put refuses as too far ahead, it is not waited for
  // when this worker reaches `round`: its sender was told, and will not send it again.
  void Note(int64_t round, int sender);

  // A neighbour is at most one round ahead while both mix (it needs this worker's message to
  // finish its round), so one seen this many rounds (× steps_per_round steps) past `round` went
  // on without this worker (its deadline dropped us, or it was cut off in a split graph): the
  // message it sent for `round`, if any, is not coming (it was refused as too far ahead).
  // Waiting for it would cost a round deadline every round, and two groups that drifted further
  // apart than the window would never meet again; not waiting lets this worker catch up at full
  // speed.
  static constexpr int64_t kPassedBy = 3;
  // The most (round, sender) pairs given up ahead of time (messages refused as too far ahead
  // from a flood of rounds are not all remembered; kPassedBy still covers their senders).
  static constexpr size_t kMaxGivenUp = 4096;

  // Waits until every sender in `wait_for` has a message for `round`, was given up, or was seen
  // kPassedBy rounds past it (or `deadline`, or Close()), then returns the messages for `round`
  // from the senders in `accept` (a superset of `wait_for`), discards everything older, and closes
  // `round`.
  std::map<int, GossipMessage> Take(int64_t round, const std::vector<int>& wait_for,
                                    const std::vector<int>& accept, absl::Time deadline);
  // Waits as Take() does, up to `until`, without taking or closing anything; returns the senders
  // of `wait_for` still missing (empty: Take() would not wait).
  std::vector<int> Await(int64_t round, const std::vector<int>& wait_for, absl::Time until);

  // Stops Take() waiting for `sender` in `round` (its push failed: it is gone).
  void GiveUp(int64_t round, int sender);
  // Another process speaks for `sender` now (it restarted, or came back elsewhere). If one sent
  // as `sender` before, what it had not sent will not come: Take() stops waiting for `sender` in
  // every open round up to `round`. One never heard from is a worker starting for the first
  // time, which may still send for those rounds: nothing changes. A message that is here, or
  // comes while another sender is awaited, is still taken.
  void Replaced(int sender, int64_t round);

  // Closes every round below `round` without waiting (steps that do not communicate).
  void Skip(int64_t round);

  // Wakes Take() and refuses further messages.
  void Close();

  // The lowest round still open.
  int64_t floor() const;

 private:
  absl::Status CheckRoundLocked(int64_t round) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteLocked(int64_t round, int sender) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives up (round, sender) if `round` is beyond the window.
  void RefusedLocked(int64_t round, int sender) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasAll(int64_t round, const std::vector<int>& senders) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropBelow(int64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_ahead_;  // in steps
  const int64_t passed_by_;  // kPassedBy rounds, in steps
  mutable absl::Mutex mu_;
  int64_t floor_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::pair<int64_t, int>, GossipMessage> messages_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<int64_t, int>> given_up_ ABSL_GUARDED_BY(mu_);
  std::map<int, int64_t> latest_ ABSL_GUARDED_BY(mu_);  // the furthest round seen per sender
};

}  // namespace tern

#endif  // TERN_WORKER_GOSSIP_INBOX_H_
