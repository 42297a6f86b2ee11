#include "server/round.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/spec.h"
#include "common/status_macros.h"

namespace tern {

absl::StatusOr<RoundPolicy::Sampling> ParseSampling(absl::string_view name) {
  if (name == "uniform") return RoundPolicy::Sampling::kUniform;
  if (name == "score") return RoundPolicy::Sampling::kScore;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown client sampling '", name, "' (uniform, score)"));
}

double Staleness::Weight(int64_t tau) const {
  const double t = static_cast<double>(std::max<int64_t>(0, tau));
  switch (kind) {
    case Kind::kConst:
      return 1.0;
    case Kind::kHinge:
      return t <= b ? 1.0 : 1.0 / (1.0 + a * (t - b));
    case Kind::kPoly:
      break;
  }
  return std::pow(1.0 + t, -a);
}

absl::StatusOr<Staleness> ParseStaleness(absl::string_view spec) {
  auto parsed = SpecParams::ParseSpec(spec);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--staleness=", spec, ": ", parsed.status().message()));
  }
  auto& [name, p] = *parsed;
  Staleness s;
  absl::StatusOr<double> a = 0.0, b = 0.0;
  if (name == "poly") {
    a = p.Double("a", 0.5, 0, 16);
  } else if (name == "hinge") {
    s.kind = Staleness::Kind::kHinge;
    a = p.Double("a", 10, 0, 1e6);
    b = p.Double("b", 4, 0, 1e9);
  } else if (name == "const") {
    s.kind = Staleness::Kind::kConst;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown --staleness '", name, "' (poly:a=A, hinge:a=A,b=B, const; each with ,max=M)"));
  }
  absl::StatusOr<int64_t> max = p.Int("max", 0, 0, int64_t{1} << 40);
  for (const absl::Status& st : {a.status(), b.status(), max.status()}) {
    if (!st.ok())
      return absl::InvalidArgumentError(absl::StrCat("--staleness=", spec, ": ", st.message()));
  }
  TERN_RETURN_IF_ERROR(p.CheckAllUsed(absl::StrCat("--staleness=", name)));
  s.a = *a;
  s.b = *b;
  s.max = *max;
  return s;
}

namespace {
constexpr size_t kRecentOpens = 8;
}  // namespace

RoundTracker::RoundTracker(RoundPolicy policy)
    : policy_(policy), learner_(LearnedDeadline(policy)), deadline_(policy.deadline) {}

void RoundTracker::SetAvailable(std::set<int> clients) { available_ = std::move(clients); }

void RoundTracker::SetScore(int client, double score) {
  scores_[client] = score > 0 && std::isfinite(score) ? score : 1.0;
}

uint32_t RoundTracker::NextRoundClients(size_t available) const {
  return static_cast<uint32_t>(
      std::min(available, static_cast<size_t>(std::max(1, policy_.clients_per_round))));
}

absl::StatusOr<std::vector<int>> RoundTracker::Open(absl::Time now) {
  if (open_) return absl::FailedPreconditionError(absl::StrCat("round ", round_, " is open"));
  if (available_.empty()) return absl::FailedPreconditionError("no client is available");
  std::vector<int> pool(available_.begin(), available_.end());
  const size_t k = NextRoundClients(pool.size());
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
    return ReplyDecision{.verdict = ReplyVerdict::kAccepted};
  }
  if (round < 1 || round > round_) {
    return absl::OutOfRangeError(absl::StrCat("round ", round, " does not exist (current round ",
                                              round_, open_ ? ", open)" : ", closed)"));
  }
  // A late reply from a client of that round: its arrival counts for the deadline either way.
  ObserveArrival(client, round, now);
  auto it = recent_.find(round);
  if (it == recent_.end()) {
    // Late: its round is closed.
    return ReplyDecision{.verdict = ReplyVerdict::kDropped, .weight_scale = 0.0};
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
  return ReplyDecision{.verdict = ReplyVerdict::kAcceptedStale,
                       .weight_scale = std::pow(policy_.staleness_decay, static_cast<double>(age)),
                       .staleness = age};
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

void RoundTracker::Save(internal::AggregatorCheckpoint* ckpt) const {
  ckpt->set_round_open(open_);
  if (open_) {
    for (int s : sampled_) ckpt->add_sampled(static_cast<uint32_t>(s));
    for (int s : replied_) ckpt->add_replied(static_cast<uint32_t>(s));
  }
  ckpt->set_sampling_draws(draws_);
}

void RoundTracker::Restore(const internal::AggregatorCheckpoint& ckpt,
                           const std::vector<internal::LoggedUpdate>& logged, absl::Time now) {
  std::vector<int> sampled(ckpt.sampled().begin(), ckpt.sampled().end());
  std::set<int> replied(ckpt.replied().begin(), ckpt.replied().end());
  for (const internal::LoggedUpdate& u : logged) {
    if (!u.stale()) replied.insert(static_cast<int>(u.client()));
  }
  Restore(static_cast<int64_t>(ckpt.round()) + (ckpt.round_open() ? 1 : 0), ckpt.round_open(),
          std::move(sampled), std::move(replied), ckpt.sampling_draws(), now);
}

}  // namespace tern
