// The parameters a worker kept after some of its steps (`tern run` evaluates them), the newest
// `max_kept` of them: keeping one more evicts the oldest.
//
// Thread-safety: thread-safe.
#ifndef TERN_WORKER_SNAPSHOT_STORE_H_
#define TERN_WORKER_SNAPSHOT_STORE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tern {

class SnapshotStore {
 public:
  explicit SnapshotStore(int max_kept) : max_kept_(max_kept) {}

  // Takes `x` (the caller's copy, made outside the lock: a model may be large).
  void Keep(int64_t step, std::vector<float> x) ABSL_LOCKS_EXCLUDED(mu_);
  // The parameters after `step` steps, if kept and not evicted since.
  std::optional<std::vector<float>> Get(int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  // The steps kept now, oldest first.
  std::vector<int64_t> Steps() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int max_kept_;
  mutable absl::Mutex mu_;
  std::map<int64_t, std::vector<float>> kept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern

#endif  // TERN_WORKER_SNAPSHOT_STORE_H_
