#include "server/round.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/rng.h"

namespace tern {

absl::StatusOr<RoundPolicy::Sampling> ParseSampling(absl::string_view name) {
  if (name == "uniform") return RoundPolicy::Sampling::kUniform;
  if (name == "score") return RoundPolicy::Sampling::kScore;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown client sampling '", name, "' (uniform, score)"));
}

namespace {
constexpr size_t kRecentOpens = 8;
}  // namespace

RoundTracker::RoundTracker(RoundPolicy policy)
    : policy_(policy),
      learner_(
          {.k = policy.deadline_k, .floor = policy.deadline_floor, .ceiling = policy.deadline}),
      deadline_(policy.deadline) {}

void RoundTracker::SetAvailable(std::set<int> clients) { available_ = std::move(clients); }

void RoundTracker::SetScore(int client, double score) {
  scores_[client] = score > 0 && std::isfinite(score) ? score : 1.0;
}

absl::StatusOr<std::vector<int>> RoundTracker::Open(absl::Time now) {
  if (open_) return absl::FailedPreconditionError(absl::StrCat("round ", round_, " is open"));
  if (available_.empty()) return absl::FailedPreconditionError("no client is available");
  std::vector<int> pool(available_.begin(), available_.end());
  const size_t k =
      std::min(pool.size(), static_cast<size_t>(std::max(1, policy_.clients_per_round)));
  std::vector<int> chosen;
  // Weighted sampling without replacement (Efraimidis-Spirakis keys u^(1/w)); uniform is the
  // special case w = 1. Reproducible from (seed, draw).
  std::vector<std::pair<double, int>> keys;
  for (int c : pool) {
    const uint64_t h = Mix64(policy_.seed ^ Mix64((draws_ << 32) ^ static_cast<uint64_t>(c)));
    const double u = (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;
    double w = 1.0;
    if (policy_.sampling == RoundPolicy::Sampling::kScore) {
      auto it = scores_.find(c);
      w = it == scores_.end() ? 1.0 : it->second;
    }
    keys.push_back({std::log(u) / w, c});
  }
  ++draws_;
  std::partial_sort(keys.begin(), keys.begin() + static_cast<long>(k), keys.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < k; ++i) chosen.push_back(keys[i].second);
  std::sort(chosen.begin(), chosen.end());
  ++round_;
  open_ = true;
  opened_ = now;
  deadline_ = learner_.Deadline();
  recent_opens_[round_] = {now, std::set<int>(chosen.begin(), chosen.end())};
  while (recent_opens_.size() > kRecentOpens) recent_opens_.erase(recent_opens_.begin());
  min_reached_ = absl::InfiniteFuture();
  sampled_ = chosen;
  replied_.clear();
  spent_.clear();
  return chosen;
}

absl::StatusOr<ReplyDecision> RoundTracker::Reply(int client, int64_t round, absl::Time now) {
  if (open_ && round == round_) {
    if (!IsSampled(client)) {
      return absl::PermissionDeniedError(
          absl::StrCat("client ", client, " was not sampled for round ", round));
    }
    if (spent_.count(client) > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("client ", client, "'s update for round ", round,
                       " was refused; its turn in this round is spent"));
    }
    if (!replied_.insert(client).second) {
      return absl::AlreadyExistsError(
          absl::StrCat("client ", client, " already replied for round ", round));
    }
    const int needed = std::min<int>(policy_.min_replies, static_cast<int>(sampled_.size()));
    if (static_cast<int>(replied_.size()) == needed) min_reached_ = now;
    ObserveArrival(client, round, now);
    return ReplyDecision{ReplyVerdict::kAccepted, 1.0};
  }
  if (round < 1 || round > round_) {
    return absl::OutOfRangeError(absl::StrCat("round ", round, " does not exist (current round ",
                                              round_, open_ ? ", open)" : ", closed)"));
  }
  // A late reply from a client of that round: its arrival counts for the deadline either way.
  ObserveArrival(client, round, now);
  auto it = recent_.find(round);
  if (it == recent_.end()) {
    return ReplyDecision{ReplyVerdict::kDropped, 0.0};  // late: its round is closed
  }
  auto& [sampled, replied] = it->second;
  if (sampled.count(client) == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("client ", client, " was not sampled for round ", round));
  }
  if (!replied.insert(client).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("client ", client, " already replied for round ", round));
  }
  const int64_t age = (open_ ? round_ : round_ + 1) - round;
  return ReplyDecision{ReplyVerdict::kAcceptedStale,
                       std::pow(policy_.staleness_decay, static_cast<double>(age))};
}

void RoundTracker::ObserveArrival(int client, int64_t round, absl::Time now) {
  auto it = recent_opens_.find(round);
  if (it == recent_opens_.end() || it->second.second.erase(client) == 0) return;
  learner_.Observe(now - it->second.first);
}

void RoundTracker::Unreply(int client, int64_t round) {
  if (open_ && round == round_) {
    replied_.erase(client);
    const int needed = std::min<int>(policy_.min_replies, static_cast<int>(sampled_.size()));
    if (static_cast<int>(replied_.size()) < needed) min_reached_ = absl::InfiniteFuture();
    return;
  }
  if (auto it = recent_.find(round); it != recent_.end()) it->second.second.erase(client);
}

void RoundTracker::Spend(int client, int64_t round) {
  if (!open_ || round != round_ || replied_.count(client) > 0 || !IsSampled(client)) {
    return;
  }
  spent_.insert(client);
}

bool RoundTracker::Awaits(int client) const {
  return open_ && IsSampled(client) && replied_.count(client) == 0 && spent_.count(client) == 0;
}

absl::Time RoundTracker::CloseTime() const {
  if (!open_) return absl::InfinitePast();
  const absl::Time hard = opened_ + deadline_;
  if (replied_.size() + spent_.size() == sampled_.size()) return opened_;
  if (min_reached_ == absl::InfiniteFuture()) return hard;
  return std::min(hard, min_reached_ + policy_.grace);
}

std::vector<int> RoundTracker::Close() {
  if (!open_) return {};
  open_ = false;
  if (policy_.staleness_decay > 0 && policy_.max_staleness > 0) {
    recent_[round_] = {std::set<int>(sampled_.begin(), sampled_.end()), replied_};
    while (!recent_.empty() && recent_.begin()->first <= round_ - policy_.max_staleness) {
      recent_.erase(recent_.begin());
    }
  }
  return std::vector<int>(replied_.begin(), replied_.end());
}

void RoundTracker::Restore(int64_t round, bool open, std::vector<int> sampled,
                           std::set<int> replied, uint64_t draws, absl::Time now) {
  round_ = round;
  open_ = open;
  opened_ = now;
  deadline_ = learner_.Deadline();
  std::sort(sampled.begin(), sampled.end());
  sampled_ = std::move(sampled);
  replied_ = std::move(replied);
  spent_.clear();
  draws_ = draws;
  recent_.clear();
  const int needed = std::min<int>(policy_.min_replies, static_cast<int>(sampled_.size()));
  min_reached_ = open && static_cast<int>(replied_.size()) >= needed ? now : absl::InfiniteFuture();
}

}  // namespace tern
