// The parameters a worker kept after some of its steps (`tern run` evaluates them), the newest
// `max_kept` of them: keeping one more evicts the oldest.
//
// Thread-safety: thread-safe.
#ifndef TERN_WORKER_SNAPSHOT_STORE_H_
#define TERN_WORKER_SNAPSHOT_STORE_H_

#include <cstdint>
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
    std::unique_ptr<float[]> data;  // default-initialised: no pass zeroing it
    size_t n = 0;
  };
  std::map<int64_t, Values> kept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern

#endif  // TERN_WORKER_SNAPSHOT_STORE_H_
