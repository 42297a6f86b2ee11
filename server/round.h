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
#include "server/rounds.h"

namespace tern {

class RoundTracker : public Rounds {
 public:
  explicit RoundTracker(RoundPolicy policy);

  // Clients available for sampling (registered and alive), by id.
  void SetAvailable(std::set<int> clients) override;
  // Sampling score of a client (> 0; the default 1 is uniform).
  void SetScore(int client, double score);

  // Opens round `round()+1` at `now`, sampling min(K, available) clients; returns them.
  // FailedPrecondition while a round is open or when no client is available.
  absl::StatusOr<std::vector<int>> Open(absl::Time now) override;
  bool open() const override { return open_; }
  int64_t round() const override { return round_; }
  const std::vector<int>& sampled() const { return sampled_; }
  int replies() const { return static_cast<int>(replied_.size()); }

  // A reply from `client` for `round` arriving at `now`. Errors (the RPC answers them): a round
  // that never existed or is too old (OutOfRange), a client not sampled in it
  // (PermissionDenied), a second reply (AlreadyExists).
  absl::StatusOr<ReplyDecision> Reply(int client, int64_t round, absl::Time now) override;
  // Takes back a reply Reply took (its update could not be made durable), so that the client
  // may send it again; nothing when that round is no longer open or kept.
  void Unreply(int client, int64_t round) override;
  // `client`'s update for the open round `round` was refused for what it held (malformed, not
  // finite, over the norm guard): its turn is spent. It gets no task again this round and its
  // replies are refused, so a client cannot draw again and again until one update gets past the
  // guard; the round no longer waits for it. Nothing for a client not sampled, or another round.
  void Spend(int client, int64_t round) override;
  // Whether `client` is sampled for the open round and has neither replied nor spent its turn.
  bool Awaits(int client) const;
  // Rounds: a sampled client trains while it Awaits; each round's sample is woken as it opens.
  Turn Take(int client, absl::Time) override { return {.train = Awaits(client)}; }
  uint32_t round_clients() const override { return static_cast<uint32_t>(sampled_.size()); }
  // min(K, available).
  uint32_t NextRoundClients(size_t available) const override;
  std::optional<std::vector<int>> ToWake() const override {
    return open_ ? sampled_ : std::vector<int>();
  }

  // The open (or last) round's deadline, fixed as it opened, and what a learned one was made of.
  absl::Duration deadline() const override { return deadline_; }
  DeadlineLearner::Fit deadline_fit() const override { return learner_.Current(); }
  bool deadline_learned() const override { return learner_.learning(); }

  // When the open round should close given what arrived so far (InfiniteFuture if never before
  // its deadline), and whether it should close at `now`.
  absl::Time CloseTime() const;
  bool ShouldClose(absl::Time now) const override { return open_ && now >= CloseTime(); }
  // Closes the open round; returns the clients that replied in time.
  std::vector<int> Close() override;

  // For checkpoints: the replies so far and the number of sampling draws made; Restore puts a
  // tracker back at `round` (open with `sampled` and `replied`, its deadline counted from `now`,
  // or closed). Closed rounds' stale-reply windows are not restored: late replies for them are
  // dropped after a restart.
  const std::set<int>& replied_set() const { return replied_; }
  uint64_t draws() const { return draws_; }
  void Restore(int64_t round, bool open, std::vector<int> sampled, std::set<int> replied,
               uint64_t draws, absl::Time now);
  // The same through the checkpoint: the open round's sample and replies (the logged updates'
  // too) and the draws.
  void Save(internal::AggregatorCheckpoint* ckpt) const override;
  void Restore(const internal::AggregatorCheckpoint& ckpt,
               const std::vector<internal::LoggedUpdate>& logged, absl::Time now) override;

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
