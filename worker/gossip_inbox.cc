#include "worker/gossip_inbox.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tern {

absl::Status GossipInbox::CheckRound(int64_t round) const {
  absl::MutexLock lock(&mu_);
  return CheckRoundLocked(round);
}

void GossipInbox::Note(int64_t round, int sender) {
  absl::MutexLock lock(&mu_);
  NoteLocked(round, sender);
  RefusedLocked(round, sender);
}

void GossipInbox::RefusedLocked(int64_t round, int sender) {
  // Its sender was told OUT_OF_RANGE and will not send it again: Take must not wait for it.
  if (round >= floor_ + max_ahead_ && given_up_.size() < kMaxGivenUp) {
    given_up_.insert({round, sender});
  }
}

void GossipInbox::NoteLocked(int64_t round, int sender) {
  auto [seen, first] = latest_.try_emplace(sender, round);
  if (!first) seen->second = std::max(seen->second, round);
}

absl::Status GossipInbox::Put(int64_t round, int sender, GossipMessage msg) {
  absl::MutexLock lock(&mu_);
  NoteLocked(round, sender);
  if (absl::Status s = CheckRoundLocked(round); !s.ok()) {
    RefusedLocked(round, sender);
    return s;
  }
  auto [it, inserted] = messages_.try_emplace({round, sender}, std::move(msg));
  if (!inserted) {
    return absl::AlreadyExistsError(
        absl::StrCat("already have a message from worker ", sender, " for round ", round));
  }
  return absl::OkStatus();
}

absl::Status GossipInbox::CheckRoundLocked(int64_t round) const {
  if (closed_) return absl::CancelledError("worker is shutting down");
  if (round < floor_) {
    return absl::OutOfRangeError(absl::StrCat(
        "round ", round, " is already closed here (this worker is at round ", floor_, ")"));
  }
  if (round >= floor_ + max_ahead_) {
    return absl::OutOfRangeError(absl::StrCat("round ", round, " is more than ", max_ahead_,
                                              " rounds ahead of this worker (at round ", floor_,
                                              ")"));
  }
  return absl::OkStatus();
}

bool GossipInbox::HasAll(int64_t round, const std::vector<int>& senders) const {
  for (int s : senders) {
    if (messages_.count({round, s}) != 0 || given_up_.count({round, s}) != 0) continue;
    auto seen = latest_.find(s);
    if (seen != latest_.end() && seen->second >= round + passed_by_) continue;
    return false;
  }
  return true;
}

void GossipInbox::DropBelow(int64_t round) {
  messages_.erase(messages_.begin(), messages_.lower_bound({round, -1}));
  given_up_.erase(given_up_.begin(), given_up_.lower_bound({round, -1}));
  floor_ = std::max(floor_, round);
}

std::map<int, GossipMessage> GossipInbox::Take(int64_t round, const std::vector<int>& wait_for,
                                               const std::vector<int>& accept,
                                               absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || HasAll(round, wait_for);
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  std::map<int, GossipMessage> out;
  for (int s : accept) {
    auto it = messages_.find({round, s});
    if (it != messages_.end()) out.emplace(s, std::move(it->second));
  }
  DropBelow(round + 1);
  return out;
}

std::vector<int> GossipInbox::Await(int64_t round, const std::vector<int>& wait_for,
                                    absl::Time until) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || HasAll(round, wait_for);
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), until);
  std::vector<int> missing;
  if (closed_) return missing;
  for (int s : wait_for) {
    if (!HasAll(round, {s})) missing.push_back(s);
  }
  return missing;
}

void GossipInbox::GiveUp(int64_t round, int sender) {
  absl::MutexLock lock(&mu_);
  if (round >= floor_) given_up_.insert({round, sender});
}

void GossipInbox::Replaced(int sender, int64_t round) {
  absl::MutexLock lock(&mu_);
  if (latest_.count(sender) == 0) return;
  // Open rounds past the window hold nothing yet, and Put refuses them anyway.
  const int64_t last = std::min(round, floor_ + max_ahead_ - 1);
  for (int64_t r = floor_; r <= last && given_up_.size() < kMaxGivenUp; ++r) {
    given_up_.insert({r, sender});
  }
}

void GossipInbox::Skip(int64_t round) {
  absl::MutexLock lock(&mu_);
  DropBelow(round);
}

void GossipInbox::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

int64_t GossipInbox::floor() const {
  absl::MutexLock lock(&mu_);
  return floor_;
}

}  // namespace tern
