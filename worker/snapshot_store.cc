#include "worker/snapshot_store.h"

#include <utility>

namespace tern {

void SnapshotStore::Keep(int64_t step, std::vector<float> x) {
  std::vector<float> evicted;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  kept_[step] = std::move(x);
  while (static_cast<int>(kept_.size()) > max_kept_) {
    evicted = std::move(kept_.begin()->second);
    kept_.erase(kept_.begin());
  }
}

std::optional<std::vector<float>> SnapshotStore::Get(int64_t step) const {
  absl::MutexLock lock(&mu_);
  auto it = kept_.find(step);
  if (it == kept_.end()) return std::nullopt;
  return it->second;
}

std::vector<int64_t> SnapshotStore::Steps() const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> steps;
  for (const auto& [step, x] : kept_) steps.push_back(step);
  return steps;
}

}  // namespace tern
