#include "worker/snapshot_store.h"

#include <utility>

namespace tern {

void SnapshotStore::Keep(int64_t step, absl::Span<const float> x) {
  std::vector<float> copy(x.begin(), x.end());  // outside the lock: a model may be large
  absl::MutexLock lock(&mu_);
  kept_[step] = std::move(copy);
  while (static_cast<int>(kept_.size()) > max_kept_) kept_.erase(kept_.begin());
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
