#include "server/buffered_rounds.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rng.h"

namespace tern {

namespace {
// A slot set aside for a drawn waiter is kept this long for its fetch (the service wakes a
// parked fetch at once); a client that has not asked this long is no longer waiting (a parked
// fetch asks again within its long poll, at most 30 s).
constexpr absl::Duration kOfferKept = absl::Seconds(5);
constexpr absl::Duration kStillWaiting = absl::Seconds(35);
}  // namespace

BufferedRounds::BufferedRounds(RoundPolicy policy)
    : policy_(policy), learner_(LearnedDeadline(policy)), deadline_(policy.deadline) {}

absl::StatusOr<std::vector<int>> BufferedRounds::Open(absl::Time) {
  if (open_) return absl::FailedPreconditionError(absl::StrCat("version ", round_, " is open"));
  if (available_.empty()) return absl::FailedPreconditionError("no client is available");
  ++round_;
  open_ = true;
  deadline_ = learner_.Deadline();
  return std::vector<int>();
}

void BufferedRounds::Hold(int client, Slot slot) {
  Free(client);
  in_flight_[client] = slot;
  by_since_.insert({slot.since, client});
}

void BufferedRounds::Free(int client) {
  auto it = in_flight_.find(client);
  if (it == in_flight_.end()) return;
  by_since_.erase({it->second.since, client});
  in_flight_.erase(it);
}

void BufferedRounds::Expire(absl::Time now) {
  while (!by_since_.empty() && now - by_since_.begin()->first > deadline_) {
    const int client = by_since_.begin()->second;
    expired_[client] = in_flight_.at(client);
    Free(client);
  }
}

bool BufferedRounds::Offer(absl::Time now) {
  for (auto o = offers_.begin(); o != offers_.end();) {
    o = now - o->second > kOfferKept ? offers_.erase(o) : std::next(o);
  }
  for (auto w = waiting_.begin(); w != waiting_.end();) {
    w = now - w->second > kStillWaiting ? waiting_.erase(w) : std::next(w);
  }
  bool offered = false;
  while (!waiting_.empty() &&
         static_cast<int>(in_flight_.size() + offers_.size()) < policy_.concurrency) {
    auto w = waiting_.begin();
    std::advance(w, static_cast<long>(Mix64(policy_.seed ^ Mix64(++draws_)) % waiting_.size()));
    offers_[w->first] = now;
    waiting_.erase(w);
    offered = true;
  }
  return offered;
}

Rounds::Turn BufferedRounds::Take(int client, absl::Time now) {
  Turn turn;
  if (!open_) return turn;
  Expire(now);
  if (spent_.count(client) > 0) return turn;
  if (auto it = in_flight_.find(client); it != in_flight_.end() && it->second.round == round_) {
    // The same task again (its answer may have been lost).
    const uint32_t n = attempts_[client];
    turn.train = true;
    turn.attempt = n > 0 ? n - 1 : 0;
    return turn;
  } else if (it == in_flight_.end() && policy_.concurrency > 0 && offers_.erase(client) == 0) {
    waiting_[client] = now;
    turn.offered = Offer(now);
    if (offers_.erase(client) == 0) return turn;
    turn.offered = offers_.size() > 0;  // others were drawn too
  }
  // A client fetching while it holds a slot on an older version gave that task up: it takes
  // this version instead, in the same slot.
  waiting_.erase(client);
  expired_.erase(client);
  Hold(client, {round_, now});
  turn.train = true;
  turn.attempt = attempts_[client]++;
  return turn;
}

absl::StatusOr<ReplyDecision> BufferedRounds::Reply(int client, int64_t round, absl::Time now) {
  if (round < 1 || round > round_) {
    return absl::OutOfRangeError(absl::StrCat("version ", round, " does not exist (current ",
                                              round_, open_ ? ", open)" : ", closed)"));
  }
  auto it = in_flight_.find(client);
  if ((it == in_flight_.end() || it->second.round != round) && round <= restored_round_ &&
      buffered_.count({client, round}) == 0 && unrecorded_.insert(client).second) {
    // A slot taken after the last snapshot is not in it: after a restart, each client may
    // bring one update made from a version before it.
    Hold(client, {round, restored_at_});
    it = in_flight_.find(client);
  }
  if (it == in_flight_.end() || it->second.round != round) {
    if (auto e = expired_.find(client); e != expired_.end() && e->second.round == round) {
      learner_.Observe(now - e->second.since);  // the deadline learns from the late ones too
      expired_.erase(e);
      return ReplyDecision{.verdict = ReplyVerdict::kDropped, .weight_scale = 0.0};
    }
    if (buffered_.count({client, round}) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("client ", client, " already replied for version ", round));
    }
    if (round == round_ && spent_.count(client) > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("client ", client, "'s update for version ", round,
                       " was refused; its turn on this version is spent"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat("client ", client, " holds no task on version ", round));
  }
  const absl::Time since = it->second.since;
  const absl::Duration took = now - since;
  learner_.Observe(took);
  Free(client);
  if (policy_.concurrency > 0) Offer(now);
  const int64_t tau = (open_ ? round_ : round_ + 1) - round;
  if (policy_.staleness.max > 0 && tau > policy_.staleness.max) {
    return ReplyDecision{.verdict = ReplyVerdict::kDropped,
                         .weight_scale = 0.0,
                         .staleness = tau,
                         .frees_slot = true};
  }
  buffered_.insert({{client, round}, {since, took}});
  return ReplyDecision{.verdict = tau == 0 ? ReplyVerdict::kAccepted : ReplyVerdict::kAcceptedStale,
                       .value_scale = policy_.staleness.Weight(tau),
                       .staleness = tau,
                       .frees_slot = true};
}

void BufferedRounds::Unreply(int client, int64_t round) {
  auto it = buffered_.find({client, round});
  if (it == buffered_.end()) return;
  const Buffered taken = it->second;
  buffered_.erase(it);
  Hold(client, {round, taken.since});
  // Its time is learned again when the client brings the update back: one sample, not two.
  learner_.Forget(taken.took);
  // Reply may have set the slot it freed aside for a waiter. Taken back, the newest such offer
  // is withdrawn (its client waits again), so that no more than `concurrency` clients train.
  while (policy_.concurrency > 0 && !offers_.empty() &&
         static_cast<int>(in_flight_.size() + offers_.size()) > policy_.concurrency) {
    auto newest =
        std::max_element(offers_.begin(), offers_.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    waiting_[newest->first] = newest->second;
    offers_.erase(newest);
  }
}

void BufferedRounds::Spend(int client, int64_t round) {
  auto it = in_flight_.find(client);
  if (it == in_flight_.end() || it->second.round != round) return;
  Free(client);
  spent_.insert(client);
}

std::vector<int> BufferedRounds::Close() {
  if (!open_) return {};
  open_ = false;
  std::set<int> clients;
  for (const auto& [key, b] : buffered_) clients.insert(key.first);
  buffered_.clear();
  spent_.clear();
  attempts_.clear();
  return std::vector<int>(clients.begin(), clients.end());
}

void BufferedRounds::Save(internal::AggregatorCheckpoint* ckpt) const {
  ckpt->set_round_open(open_);
  for (const auto& [client, slot] : in_flight_) {
    internal::ClientRound* c = ckpt->add_in_flight();
    c->set_client(static_cast<uint32_t>(client));
    c->set_round(static_cast<uint64_t>(slot.round));
  }
  for (const auto& [key, b] : buffered_) {
    internal::ClientRound* c = ckpt->add_buffered();
    c->set_client(static_cast<uint32_t>(key.first));
    c->set_round(static_cast<uint64_t>(key.second));
  }
}

void BufferedRounds::Restore(const internal::AggregatorCheckpoint& ckpt,
                             const std::vector<internal::LoggedUpdate>& logged, absl::Time now) {
  round_ = static_cast<int64_t>(ckpt.round()) + (ckpt.round_open() ? 1 : 0);
  open_ = ckpt.round_open();
  deadline_ = learner_.Deadline();
  in_flight_.clear();
  by_since_.clear();
  expired_.clear();
  attempts_.clear();
  waiting_.clear();
  offers_.clear();
  spent_.clear();
  buffered_.clear();
  unrecorded_.clear();
  restored_round_ = round_;
  restored_at_ = now;
  // Slots count from now: a client training through the restart still has its whole deadline.
  for (const internal::ClientRound& c : ckpt.in_flight()) {
    Hold(static_cast<int>(c.client()), {static_cast<int64_t>(c.round()), now});
  }
  for (const internal::ClientRound& c : ckpt.buffered()) {
    buffered_.insert({{static_cast<int>(c.client()), static_cast<int64_t>(c.round())}, {now}});
  }
  for (const internal::LoggedUpdate& u : logged) {
    const int client = static_cast<int>(u.client());
    const int64_t round = static_cast<int64_t>(u.round());
    if (auto it = in_flight_.find(client); it != in_flight_.end() && it->second.round == round) {
      Free(client);
    }
    buffered_.insert({{client, round}, {now}});
  }
}

}  // namespace tern
