// The parameters a worker kept after some of its steps (`tern run` evaluates them), the newest
// `max_kept` of them: keeping one more evicts the oldest.
//
// Thread-safety: thread-safe.
#ifndef TERN_WORKER_SNAPSHOT_STORE_H_
#define TERN_WORKER_SNAPSHOT_STORE_H_

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tern {

class SnapshotStore {
 public:
  explicit SnapshotStore(int max_kept) : max_kept_(max_kept) {}

  // Keeps `n` values that `fill` writes, every one of them, outside the lock (a model may be
  // large). The buffer is not zeroed first, and once the store is full it is the evicted one's
  // (when the sizes agree): a worker keeping a snapshot every few steps faults in no fresh pages
  // and clears none.
  void Keep(int64_t step, size_t n, absl::FunctionRef<void(absl::Span<float>)> fill)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Makes `count` buffers of `n` values ready, their pages faulted in now (at registration,
  // before the first step), so that keeping a snapshot during training neither faults nor
  // clears a page. Bounded by max_kept and by kMaxReservedBytes in all.
  void Reserve(size_t n, int count) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr size_t kMaxReservedBytes = size_t{1} << 30;
  // Keeps a copy of `x`.
  void Keep(int64_t step, absl::Span<const float> x) ABSL_LOCKS_EXCLUDED(mu_);
  // The parameters after `step` steps, if kept and not evicted since.
  std::optional<std::vector<float>> Get(int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  // The steps kept now, oldest first.
  std::vector<int64_t> Steps() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int max_kept_;
  mutable absl::Mutex mu_;
  struct Values {
    struct Free {
      void operator()(float* p) const { std::free(p); }
    };
    std::unique_ptr<float, Free> data;  // not zeroed: fill writes every value
    size_t n = 0;
  };
  std::map<int64_t, Values> kept_ ABSL_GUARDED_BY(mu_);
  std::vector<Values> ready_ ABSL_GUARDED_BY(mu_);  // Reserve's, not yet used
};

}  // namespace tern

#endif  // TERN_WORKER_SNAPSHOT_STORE_H_
