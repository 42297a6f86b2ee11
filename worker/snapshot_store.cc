#include "worker/snapshot_store.h"

#include <algorithm>
#include <utility>

namespace tern {

void SnapshotStore::Keep(int64_t step, size_t n, absl::FunctionRef<void(absl::Span<float>)> fill) {
  if (max_kept_ <= 0) return;
  Values v;
  {
    absl::MutexLock lock(&mu_);
    // The oldest goes now, not after the new one is in: its buffer is the new one's.
    while (!kept_.empty() && static_cast<int>(kept_.size()) >= max_kept_) {
      Values evicted = std::move(kept_.begin()->second);
      kept_.erase(kept_.begin());
      if (evicted.n == n) v = std::move(evicted);
    }
  }
  if (v.data == nullptr) {
    v.data.reset(new float[n]);  // NOLINT: uninitialised on purpose; fill writes every value
    v.n = n;
  }
  fill(absl::MakeSpan(v.data.get(), n));
  absl::MutexLock lock(&mu_);
  kept_[step] = std::move(v);
}

void SnapshotStore::Keep(int64_t step, absl::Span<const float> x) {
  Keep(step, x.size(), [x](absl::Span<float> out) { std::copy(x.begin(), x.end(), out.begin()); });
}

std::optional<std::vector<float>> SnapshotStore::Get(int64_t step) const {
  absl::MutexLock lock(&mu_);
  auto it = kept_.find(step);
  if (it == kept_.end()) return std::nullopt;
  return std::vector<float>(it->second.data.get(), it->second.data.get() + it->second.n);
}

std::vector<int64_t> SnapshotStore::Steps() const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> steps;
  for (const auto& [step, x] : kept_) steps.push_back(step);
  return steps;
}

}  // namespace tern
