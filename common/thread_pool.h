// A fixed-size pool of worker threads with a blocking ParallelFor, for splitting one large tensor's
// encode or decode across cores, and Schedule, for work that must not run on the caller's thread
// (a gRPC reactor handing off work that may block).
//
// Thread-safety: ParallelFor may be called from several threads at once; each call blocks until all
// of its pieces are done. The pool must outlive every call. Do not call ParallelFor from inside a
// ParallelFor body (the caller would wait on itself).
#ifndef TERN_COMMON_THREAD_POOL_H_
#define TERN_COMMON_THREAD_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tern {

class ThreadPool {
 public:
  // Starts `num_threads` workers (>= 1). The calling thread also works during ParallelFor, so a
  // pool of n - 1 threads keeps n cores busy.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()); }

  // Runs fn(begin, end) over [0, n) in pieces of at least `grain` elements, piece boundaries
  // multiples of `align` (so byte-packed outputs never share a byte between pieces).
  void ParallelFor(size_t n, size_t grain, size_t align,
                   const std::function<void(size_t, size_t)>& fn);
  // Runs `fn` on a worker, in order with other scheduled work. The destructor runs every task
  // already scheduled before it returns.
  void Schedule(std::function<void()> fn);

 private:
  void WorkerLoop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// Runs fn over [0, n) on `pool` when it is non-null and n is large enough to be worth it, else
// inline on the caller's thread.
void ParallelFor(ThreadPool* pool, size_t n, size_t grain, size_t align,
                 const std::function<void(size_t, size_t)>& fn);

}  // namespace tern

#endif  // TERN_COMMON_THREAD_POOL_H_
