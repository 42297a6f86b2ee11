// FedBuff's versions (Nguyen et al. 2022; ALGORITHMS.md section 6) in the place of rounds: no
// client waits for another. A fetching client takes one of `concurrency` slots (C) and trains on
// the open version (when clients wait for slots, a freed one goes to one of them drawn
// uniformly); its update, whatever version it was made from, joins the open version's
// buffer scaled by s(tau), tau the versions since its base (RoundPolicy.staleness); `buffer`
// updates (K) close the version, the aggregator steps and opens the next. A client may train on
// one version more than once (Take's attempt tells its seeds apart). A slot held past the deadline
// (fixed, or learned from the slots' durations) is freed, and the late update it brings is
// dropped; an update more than staleness.max versions old is dropped too. Slots are in the
// snapshots written as versions open and close, not in between (a fetch writes nothing): after a
// restart each client may bring one update made from a version before it without a recorded slot.
//
// Thread-safety: thread-compatible; the aggregator guards it with its own mutex.
#ifndef TERN_SERVER_BUFFERED_ROUNDS_H_
#define TERN_SERVER_BUFFERED_ROUNDS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/deadline.h"
#include "server/rounds.h"

namespace tern {

class BufferedRounds : public Rounds {
 public:
  explicit BufferedRounds(RoundPolicy policy);

  void SetAvailable(std::set<int> clients) override { available_ = std::move(clients); }
  absl::StatusOr<std::vector<int>> Open(absl::Time now) override;
  bool open() const override { return open_; }
  int64_t round() const override { return round_; }

  Turn Take(int client, absl::Time now) override;
  // The updates a version's step averages (DGC's per-worker clipping counts them).
  uint32_t round_clients() const override { return static_cast<uint32_t>(policy_.buffer); }
  uint32_t NextRoundClients(size_t) const override { return round_clients(); }
  // Any waiting client: a new version, or a slot set aside for it. (The clients a slot was set
  // aside for alone would miss a version that opened while their fetch waited.)
  std::optional<std::vector<int>> ToWake() const override { return std::nullopt; }

  absl::StatusOr<ReplyDecision> Reply(int client, int64_t round, absl::Time now) override;
  void Unreply(int client, int64_t round) override;
  void Spend(int client, int64_t round) override;

  absl::Duration deadline() const override { return deadline_; }
  DeadlineLearner::Fit deadline_fit() const override { return learner_.Current(); }
  bool deadline_learned() const override { return learner_.learning(); }

  bool ShouldClose(absl::Time) const override {
    return open_ && static_cast<int>(buffered_.size()) >= policy_.buffer;
  }
  std::vector<int> Close() override;

  void Save(internal::AggregatorCheckpoint* ckpt) const override;
  void Restore(const internal::AggregatorCheckpoint& ckpt,
               const std::vector<internal::LoggedUpdate>& logged, absl::Time now) override;

  // For tests and the status: clients holding a slot, updates in the open version's buffer.
  size_t in_flight() const { return in_flight_.size(); }
  size_t buffered() const { return buffered_.size(); }

 private:
  struct Slot {
    int64_t round;     // the version it trains on
    absl::Time since;  // when it took the slot
  };
  void Hold(int client, Slot slot);
  void Free(int client);
  // Frees the slots held longer than the deadline; their updates will be dropped.
  void Expire(absl::Time now);
  // Sets the free slots aside for waiting clients drawn uniformly, as FedBuff samples its
  // clients, rather than for whoever asks first: the client that just replied asks first, and
  // would otherwise take its slot straight back, so that the same C clients trained forever.
  // Runs as a reply frees a slot (its sender is not waiting yet) and as a client asks.
  // Returns whether it set one aside.
  bool Offer(absl::Time now);

  const RoundPolicy policy_;
  std::set<int> available_;
  int64_t round_ = 0;
  bool open_ = false;
  std::map<int, Slot> in_flight_;
  std::set<std::pair<absl::Time, int>> by_since_;  // in_flight_, oldest first
  std::map<int, Slot> expired_;                    // freed at the deadline, not replied yet
  std::map<int, uint32_t> attempts_;               // tasks on the open version, by client
  std::map<int, absl::Time> waiting_;  // refused for want of a slot, when they last asked
  std::map<int, absl::Time> offers_;   // slots set aside for drawn waiters, since when
  uint64_t draws_ = 0;
  std::set<int> spent_;  // refused on the open version
  // The open version's buffer: (client, version it was made from) -> when its slot was taken,
  // and how long the client took (what the deadline learned from it; negative: nothing).
  struct Buffered {
    absl::Time since;
    absl::Duration took = absl::Seconds(-1);
  };
  std::multimap<std::pair<int, int64_t>, Buffered> buffered_;
  // After a restart: the version open then, when, and the clients that brought an update from a
  // slot the snapshot did not hold (one each).
  int64_t restored_round_ = 0;
  absl::Time restored_at_ = absl::InfinitePast();
  std::set<int> unrecorded_;
  DeadlineLearner learner_;
  absl::Duration deadline_;
};

}  // namespace tern

#endif  // TERN_SERVER_BUFFERED_ROUNDS_H_
