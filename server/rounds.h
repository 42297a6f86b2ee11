// How an aggregator's rounds run, one strategy chosen once from --mode: which clients train when,
// what a reply counts for, when the aggregate is applied. RoundTracker (server/round.h):
// synchronous rounds, sampled as they open and closed on replies + grace or at the deadline.
// BufferedRounds (server/buffered_rounds.h): FedBuff, no rounds but versions: up to C clients
// train at once, each on the version it fetched, and a version closes after K buffered updates.
// The aggregator asks it under its own mutex; tests drive each alone with a fake clock.
//
// Thread-safety: implementations are thread-compatible.
#ifndef TERN_SERVER_ROUNDS_H_
#define TERN_SERVER_ROUNDS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/deadline.h"
#include "tern/internal/checkpoint.pb.h"

namespace tern {

// FedBuff's staleness function s(tau) (ALGORITHMS.md section 6): how much of an update made
// from a model tau versions old the buffer keeps. "poly:a=A" (1 + tau)^-A (the default, A = 0.5:
// 1/sqrt(1 + tau)), "const" (1), "hinge:a=A,b=B" (1 up to B, then 1 / (1 + A (tau - B)): FedAsync's
// hinge); each with ",max=M": updates more than M versions old are dropped (0: none is).
struct Staleness {
  enum class Kind { kPoly, kConst, kHinge };
  Kind kind = Kind::kPoly;
  double a = 0.5;
  double b = 0;
  int64_t max = 0;
  double Weight(int64_t tau) const;
};
absl::StatusOr<Staleness> ParseStaleness(absl::string_view spec);

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
  // FedBuff (BufferedRounds): at most `concurrency` clients training at once (0: any number),
  // a version closes after `buffer` updates, each scaled by `staleness`.
  int concurrency = 0;
  int buffer = 10;
  Staleness staleness;
};

// The learned deadline's settings from the policy's (server/deadline.h).
inline LearnedDeadlineOptions LearnedDeadline(const RoundPolicy& p) {
  return {.k = p.deadline_k, .floor = p.deadline_floor, .ceiling = p.deadline};
}

// "uniform" | "score" (clients with higher scores are sampled with higher probability).
absl::StatusOr<RoundPolicy::Sampling> ParseSampling(absl::string_view name);

enum class ReplyVerdict {
  kAccepted,       // counts for the open round as sent
  kAcceptedStale,  // made from an older model: scaled (weight_scale, value_scale)
  kDropped,        // too late; the sender should not retry
};

struct ReplyDecision {
  ReplyVerdict verdict;
  double weight_scale = 1.0;  // the update's weight is multiplied by this (synchronous rounds)
  double value_scale = 1.0;   // its values are (FedBuff's s(tau))
  int64_t staleness = 0;      // rounds (versions) since the model it was made from
  bool frees_slot = false;    // another client may now get a task (FedBuff)
};

class Rounds {
 public:
  virtual ~Rounds() = default;

  // Clients available for sampling (registered and alive), by id; set before Open.
  virtual void SetAvailable(std::set<int> clients) = 0;
  // Opens round `round()+1` at `now`; returns the clients it sampled (FedBuff: none, they take
  // slots as they fetch). FailedPrecondition while one is open or when no client is available.
  virtual absl::StatusOr<std::vector<int>> Open(absl::Time now) = 0;
  virtual bool open() const = 0;
  virtual int64_t round() const = 0;  // the open round, or the last closed one

  // Whether `client`, fetching at `now`, trains for the open round (FedBuff: takes a slot).
  struct Turn {
    bool train = false;
    uint32_t attempt = 0;  // its earlier tasks on this round (clients mix it into their seeds)
    bool offered = false;  // a slot was set aside for another client: waiting fetches may wake
  };
  virtual Turn Take(int client, absl::Time now) = 0;
  // Task.round_clients: the clients training on a round together.
  virtual uint32_t round_clients() const = 0;
  // round_clients() of the next round Open would open from `available` clients: the privacy
  // accountant's sampling rate is this over `available`, checked against the budget before the
  // round opens and spent once it has.
  virtual uint32_t NextRoundClients(size_t available) const = 0;
  // The clients whose waiting fetch may get another answer after an event; nullopt: all.
  virtual std::optional<std::vector<int>> ToWake() const = 0;

  // A reply from `client` for `round` arriving at `now`. Errors (the RPC answers them): a round
  // that never existed or is too old (OutOfRange), a client that holds no task on it
  // (PermissionDenied), a second reply (AlreadyExists), a spent turn (FailedPrecondition).
  virtual absl::StatusOr<ReplyDecision> Reply(int client, int64_t round, absl::Time now) = 0;
  // Takes back a reply Reply took (its update could not be made durable), so that the client
  // may send it again.
  virtual void Unreply(int client, int64_t round) = 0;
  // `client`'s update for `round` was refused for what it held (malformed, not finite, over the
  // norm guard): its turn is spent, and it gets no other task on the open round, so a client
  // cannot draw again and again until one update gets past the guard.
  virtual void Spend(int client, int64_t round) = 0;

  // The open (or last) round's deadline (FedBuff: how long a client may hold its slot), and
  // what a learned one was made of.
  virtual absl::Duration deadline() const = 0;
  virtual DeadlineLearner::Fit deadline_fit() const = 0;
  virtual bool deadline_learned() const = 0;

  // Whether the open round should close at `now`.
  virtual bool ShouldClose(absl::Time now) const = 0;
  // Closes the open round; returns the clients that replied in it.
  virtual std::vector<int> Close() = 0;

  // Its part of the aggregator's checkpoint, and back: `ckpt` as saved (its round the rounds
  // completed) and the updates logged after it, each already accepted; deadlines count from
  // `now`.
  virtual void Save(internal::AggregatorCheckpoint* ckpt) const = 0;
  virtual void Restore(const internal::AggregatorCheckpoint& ckpt,
                       const std::vector<internal::LoggedUpdate>& logged, absl::Time now) = 0;
};

}  // namespace tern

#endif  // TERN_SERVER_ROUNDS_H_
