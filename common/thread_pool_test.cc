#include "common/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

TEST(ThreadPool, ParallelForCoversEveryIndexExactlyOnceWithAlignedPieces) {
  ThreadPool pool(3);
  for (size_t n : {0u, 1u, 7u, 1000u, 123457u}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, 10, 8, [&](size_t b, size_t e) {
      EXPECT_EQ(b % 8, 0u);
      for (size_t i = b; i < e; ++i) hits[i]++;
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  }
}

TEST(ThreadPool, ConcurrentCallersEachGetTheirOwnCompletion) {
  ThreadPool pool(2);
  std::vector<std::thread> callers;
  std::atomic<long> total{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        std::atomic<long> local{0};
        pool.ParallelFor(10000, 100, 1, [&](size_t b, size_t e) { local += long(e - b); });
        EXPECT_EQ(local.load(), 10000);
        total += local;
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 4L * 50 * 10000);
}

TEST(ThreadPool, ScheduledTasksAllRunBeforeThePoolIsGone) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(3);
    for (int i = 0; i < 100; ++i) {
      pool.Schedule([&ran] {
        absl::SleepFor(absl::Microseconds(50));
        ++ran;
      });
    }
  }  // the destructor drains the queue
  EXPECT_EQ(ran.load(), 100);
}

TEST(ThreadPool, NullPoolRunsInline) {
  size_t seen = 0;
  ParallelFor(nullptr, 100, 10, 1, [&](size_t b, size_t e) { seen += e - b; });
  EXPECT_EQ(seen, 100u);
}

}  // namespace
}  // namespace tern
