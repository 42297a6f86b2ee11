#include "worker/snapshot_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "spdlog/spdlog.h"

namespace tern {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Room for n floats, not zeroed. From 2 MiB up, in whole transparent huge pages where the kernel
// gives them (madvise mode): a model-sized snapshot then faults in a page per 2 MiB, not per
// 4 KiB (a worker keeping one every few steps spent more in those faults than in the copy).
float* AllocateValues(size_t n) {
  const size_t bytes = n * sizeof(float);
  if (bytes < kHugePage) return static_cast<float*>(std::malloc(std::max<size_t>(bytes, 1)));
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p != nullptr) (void)::madvise(p, rounded, MADV_HUGEPAGE);  // a hint: 4 KiB pages without
  return static_cast<float*>(p);
}

}  // namespace

void SnapshotStore::Keep(int64_t step, size_t n, absl::FunctionRef<void(absl::Span<float>)> fill) {
  if (max_kept_ <= 0) return;
  // Buffers let go of here are freed after the lock is released (declared first, destroyed last):
  // freeing a model-sized buffer returns its pages to the kernel, not something to hold a lock for.
  std::vector<Values> released;
  Values v;
  {
    absl::MutexLock lock(&mu_);
    // The oldest goes now, not after the new one is in: its buffer is the new one's. A step kept
    // again replaces its own entry and evicts nothing.
    if (kept_.find(step) == kept_.end()) {
      while (!kept_.empty() && static_cast<int>(kept_.size()) >= max_kept_) {
        Values evicted = std::move(kept_.begin()->second);
        kept_.erase(kept_.begin());
        if (v.data == nullptr && evicted.n == n) {
          v = std::move(evicted);
        } else {
          released.push_back(std::move(evicted));
        }
      }
    }
    if (v.data == nullptr && !ready_.empty() && ready_.back().n == n) {
      v = std::move(ready_.back());
      ready_.pop_back();
    }
  }
  if (v.data == nullptr) {
    v.data.reset(AllocateValues(n));  // uninitialised on purpose: fill writes every value
    if (v.data == nullptr) {          // out of memory: a snapshot is not worth failing a step
      spdlog::warn("worker: no memory for a snapshot of step {} ({} values); not kept", step, n);
      return;
    }
    v.n = n;
  }
  fill(absl::MakeSpan(v.data.get(), n));
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = kept_.try_emplace(step);
  if (!inserted) released.push_back(std::move(it->second));
  it->second = std::move(v);
  // Two steps kept at once may both have found room; the newest max_kept_ stay.
  while (static_cast<int>(kept_.size()) > max_kept_) {
    released.push_back(std::move(kept_.begin()->second));
    kept_.erase(kept_.begin());
  }
}

void SnapshotStore::Reserve(size_t n, int count) {
  if (n == 0) return;
  count = std::min(count, max_kept_);
  count = static_cast<int>(std::min<size_t>(static_cast<size_t>(std::max(count, 0)),
                                            kMaxReservedBytes / (n * sizeof(float))));
  std::vector<Values> made;
  for (int i = 0; i < count; ++i) {
    Values v;
    v.data.reset(AllocateValues(n));
    if (v.data == nullptr) break;
    std::fill_n(v.data.get(), n, 0.0f);  // faulted in here, not at a step
    v.n = n;
    made.push_back(std::move(v));
  }
  absl::MutexLock lock(&mu_);
  ready_ = std::move(made);
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
