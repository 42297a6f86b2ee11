#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>

namespace tern {

ThreadPool::ThreadPool(int num_threads) {
  workers_.reserve(std::max(1, num_threads));
  for (int i = 0; i < std::max(1, num_threads); ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stopping_ || !p->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // never under the lock
  }
}

void ThreadPool::Schedule(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
}

void ThreadPool::ParallelFor(size_t n, size_t grain, size_t align,
                             const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  align = std::max<size_t>(1, align);
  const size_t parts_max = static_cast<size_t>(num_threads()) + 1;
  size_t piece = std::max(grain, (n + parts_max - 1) / parts_max);
  piece = (piece + align - 1) / align * align;
  const size_t parts = (n + piece - 1) / piece;
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  // State shared with the queued pieces; the caller waits until `pending` reaches zero.
  struct Shared {
    absl::Mutex mu;
    size_t pending ABSL_GUARDED_BY(mu);
  };
  auto shared = std::make_shared<Shared>();
  {
    absl::MutexLock lock(&shared->mu);
    shared->pending = parts - 1;
  }
  {
    absl::MutexLock lock(&mu_);
    for (size_t p = 1; p < parts; ++p) {
      const size_t begin = p * piece, end = std::min(n, begin + piece);
      queue_.emplace_back([shared, &fn, begin, end] {
        fn(begin, end);
        absl::MutexLock l(&shared->mu);
        --shared->pending;
      });
    }
  }
  fn(0, std::min(n, piece));
  absl::MutexLock lock(&shared->mu);
  shared->mu.Await(absl::Condition(
      +[](Shared* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->pending == 0; },
      shared.get()));
}

void ParallelFor(ThreadPool* pool, size_t n, size_t grain, size_t align,
                 const std::function<void(size_t, size_t)>& fn) {
  if (pool == nullptr || n < 2 * grain) {
    if (n > 0) fn(0, n);
    return;
  }
  pool->ParallelFor(n, grain, align, fn);
}

}  // namespace tern
