// Bookkeeping of one aggregator's rounds (ALGORITHMS.md §4), independent of transport and
// clock: which clients a round samples (uniform, or by a score such as the last update's norm or
// loss), when a round closes (min replies + grace, or the deadline), and what happens to a reply
// (accepted, late and dropped, late and staleness-weighted, or refused: wrong round, not
// sampled, duplicate). The gRPC server feeds it and asks it; tests drive it with a fake clock.
//
// Thread-safety: thread-compatible; the server guards it with its own mutex.
#ifndef TERN_SERVER_ROUND_H_
#define TERN_SERVER_ROUND_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/deadline.h"

namespace tern {

struct RoundPolicy {
  int clients_per_round = 10;                   // K
  int min_replies = 8;                          // a round may close once this many replied...
  absl::Duration grace = absl::Seconds(2);      // ...and this long passed since the min-th
  absl::Duration deadline = absl::Seconds(60);  // it closes at the latest here
  // Deadlines that learn (server/deadline.h): with deadline_k > 0 a round's deadline is the
  // recent arrivals' median + deadline_k spreads, within [deadline_floor, deadline].
  double deadline_k = 0;
  absl::Duration deadline_floor = absl::Seconds(1);
  // Late replies (for a closed round): dropped, or kept with weight staleness_decay^age when
  // staleness_decay > 0 and age <= max_staleness rounds.
  double staleness_decay = 0;
  int max_staleness = 0;
  enum class Sampling { kUniform, kScore };
  Sampling sampling = Sampling::kUniform;
  uint64_t seed = 1;
};

// "uniform" | "score" (clients with higher scores are sampled with higher probability).
absl::StatusOr<RoundPolicy::Sampling> ParseSampling(absl::string_view name);

enum class ReplyVerdict {
  kAccepted,       // counts for the open round, weight as sent
  kAcceptedStale,  // for a recent closed round; weight scaled by `weight_scale`
  kDropped,        // too late; the sender should not retry
};

struct ReplyDecision {
  ReplyVerdict verdict;
  double weight_scale = 1.0;
};

class RoundTracker {
 public:
  explicit RoundTracker(RoundPolicy policy);

  // Clients available for sampling (registered and alive), by id.
  void SetAvailable(std::set<int> clients);
  // Sampling score of a client (> 0; the default 1 is uniform).
  void SetScore(int client, double score);

  // Opens round `round()+1` at `now`, sampling min(K, available) clients; returns them.
  // FailedPrecondition while a round is open or when no client is available.
  absl::StatusOr<std::vector<int>> Open(absl::Time now);
  bool open() const { return open_; }
  int64_t round() const { return round_; }  // the open round, or the last closed one
  const std::vector<int>& sampled() const { return sampled_; }
  int replies() const { return static_cast<int>(replied_.size()); }

  // A reply from `client` for `round` arriving at `now`. Errors (the RPC answers them): a round
  // that never existed or is too old (OutOfRange), a client not sampled in it
  // (PermissionDenied), a second reply (AlreadyExists).
  absl::StatusOr<ReplyDecision> Reply(int client, int64_t round, absl::Time now);
  // Takes back a reply Reply took (its update could not be made durable), so that the client
  // may send it again; nothing when that round is no longer open or kept.
  void Unreply(int client, int64_t round);
  // `client`'s update for the open round `round` was refused for what it held (malformed, not
  // finite, over the norm guard): its turn is spent. It gets no task again this round and its
  // replies are refused, so a client cannot draw again and again until one update gets past the
  // guard; the round no longer waits for it. Nothing for a client not sampled, or another round.
  void Spend(int client, int64_t round);
  // Whether `client` is sampled for the open round and has neither replied nor spent its turn.
  bool Awaits(int client) const;

  // The open (or last) round's deadline, fixed as it opened, and what a learned one was made of.
  absl::Duration deadline() const { return deadline_; }
  DeadlineLearner::Fit deadline_fit() const { return learner_.Current(); }
  bool deadline_learned() const { return learner_.learning(); }

  // When the open round should close given what arrived so far (InfiniteFuture if never before
  // its deadline), and whether it should close at `now`.
  absl::Time CloseTime() const;
  bool ShouldClose(absl::Time now) const { return open_ && now >= CloseTime(); }
  // Closes the open round; returns the clients that replied in time.
  std::vector<int> Close();

  // For checkpoints: the replies so far and the number of sampling draws made; Restore puts a
  // tracker back at `round` (open with `sampled` and `replied`, its deadline counted from `now`,
  // or closed). Closed rounds' stale-reply windows are not restored: late replies for them are
  // dropped after a restart.
  const std::set<int>& replied_set() const { return replied_; }
  uint64_t draws() const { return draws_; }
  void Restore(int64_t round, bool open, std::vector<int> sampled, std::set<int> replied,
               uint64_t draws, absl::Time now);

 private:
  // Whether `client` is in the open (or last) round's sample.
  bool IsSampled(int client) const {
    return std::binary_search(sampled_.begin(), sampled_.end(), client);
  }

  RoundPolicy policy_;
  std::set<int> available_;
  std::map<int, double> scores_;
  int64_t round_ = 0;
  bool open_ = false;
  absl::Time opened_ = absl::InfinitePast();
  absl::Time min_reached_ = absl::InfiniteFuture();
  std::vector<int> sampled_;
  std::set<int> replied_;
  std::set<int> spent_;  // sampled, refused for what they sent (Spend)
  // Closed rounds still taking stale replies: round -> (sampled, replied).
  std::map<int64_t, std::pair<std::set<int>, std::set<int>>> recent_;
  // Counts `client`'s reply for `round` arriving at `now` for the deadline, once per client and
  // round, where that round is recent and sampled it.
  void ObserveArrival(int client, int64_t round, absl::Time now);

  // The last rounds' openings and the sampled clients not heard from yet, so a late reply's
  // arrival counts for the deadline too (the learner would otherwise see only what came before
  // the cut).
  std::map<int64_t, std::pair<absl::Time, std::set<int>>> recent_opens_;
  DeadlineLearner learner_;
  absl::Duration deadline_;
  uint64_t draws_ = 0;
};

}  // namespace tern

#endif  // TERN_SERVER_ROUND_H_
