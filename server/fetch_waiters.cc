#include "server/fetch_waiters.h"

#include <algorithm>
#include <utility>

namespace tern {
namespace {

void Cancel(const std::vector<std::weak_ptr<FetchWaiters::Waiter>>& waiters) {
  for (const std::weak_ptr<FetchWaiters::Waiter>& w : waiters) {
    // Cancelling an alarm that already fired does nothing.
    if (std::shared_ptr<FetchWaiters::Waiter> alive = w.lock()) alive->alarm.Cancel();
  }
}

}  // namespace

uint64_t FetchWaiters::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

bool FetchWaiters::Park(uint32_t client, const std::shared_ptr<Waiter>& waiter, uint64_t seen) {
  absl::MutexLock lock(&mu_);
  if (generation_ != seen) return false;
  std::vector<std::weak_ptr<Waiter>>& mine = parked_[client];
  std::erase_if(mine, [](const std::weak_ptr<Waiter>& w) { return w.expired(); });
  mine.push_back(waiter);
  return true;
}

void FetchWaiters::Wake(const std::vector<int>& clients) {
  std::vector<std::weak_ptr<Waiter>> woken;
  {
    absl::MutexLock lock(&mu_);
    ++generation_;
    for (int c : clients) {
      auto it = parked_.find(static_cast<uint32_t>(c));
      if (it == parked_.end()) continue;
      woken.insert(woken.end(), it->second.begin(), it->second.end());
      parked_.erase(it);
    }
  }
  Cancel(woken);
}

void FetchWaiters::WakeAll() {
  std::unordered_map<uint32_t, std::vector<std::weak_ptr<Waiter>>> woken;
  {
    absl::MutexLock lock(&mu_);
    ++generation_;
    woken.swap(parked_);
  }
  for (const auto& [client, waiters] : woken) Cancel(waiters);
}

size_t FetchWaiters::parked() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [client, waiters] : parked_) {
    n += static_cast<size_t>(
        std::count_if(waiters.begin(), waiters.end(), [](const auto& w) { return !w.expired(); }));
  }
  return n;
}

}  // namespace tern
