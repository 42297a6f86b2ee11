#include "bench/delayline/delay_queue.h"

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tern::delayline {
namespace {

TEST(DelayQueue, ReleasesNothingBeforeItsDelay) {
  DelayQueue q(/*delay_ns=*/50, /*capacity=*/10);
  ASSERT_TRUE(q.Push(1, 100));
  EXPECT_FALSE(q.PopDue(149).has_value());
  EXPECT_EQ(q.NextRelease(), 150);
}

TEST(DelayQueue, ReleasesEveryDuePacketAsTheLastDueId) {
  DelayQueue q(50, 10);
  q.Push(7, 100);
  q.Push(8, 110);
  q.Push(9, 130);
  EXPECT_EQ(q.PopDue(160), 8u);  // 7 and 8 are due, 9 is not
  EXPECT_EQ(q.held(), 1u);
  EXPECT_EQ(q.NextRelease(), 180);
  EXPECT_EQ(q.PopDue(180), 9u);
  EXPECT_EQ(q.released(), 3u);
  EXPECT_FALSE(q.NextRelease().has_value());
}

TEST(DelayQueue, DropsWhatDoesNotFitAndCountsIt) {
  DelayQueue q(50, 2);
  EXPECT_TRUE(q.Push(1, 0));
  EXPECT_TRUE(q.Push(2, 0));
  EXPECT_FALSE(q.Push(3, 0));
  EXPECT_EQ(q.dropped(), 1u);
  EXPECT_EQ(q.max_held(), 2u);
}

TEST(DelayQueue, PopAllReleasesWhatIsHeldAtOnce) {
  DelayQueue q(1'000'000, 10);
  q.Push(4, 0);
  q.Push(5, 1);
  EXPECT_EQ(q.PopAll(), 5u);
  EXPECT_EQ(q.held(), 0u);
  EXPECT_FALSE(q.PopAll().has_value());
}

TEST(DelayQueue, ZeroDelayReleasesAtOnce) {
  DelayQueue q(0, 10);
  q.Push(1, 5);
  EXPECT_EQ(q.PopDue(5), 1u);
}

TEST(DelayQueue, PoppedOnceATickEachPacketIsHeldItsDelayWithinHalfATick) {
  constexpr int64_t kDelay = 50'000, kTick = 2'500;
  DelayQueue q(kDelay, 1000, kTick);
  std::mt19937_64 rng(7);
  std::vector<int64_t> arrived;
  int64_t t = 0;
  for (uint32_t id = 0; id < 500; ++id) {
    t += std::uniform_int_distribution<int64_t>(0, 700)(rng);
    arrived.push_back(t);
    ASSERT_TRUE(q.Push(id, t));
  }
  // Ticks at kTick, 2 kTick, ...: every packet popped at a tick is checked against its arrival.
  int64_t sum = 0;
  uint32_t next = 0;
  for (int64_t tick = kTick; next < arrived.size(); tick += kTick) {
    std::optional<uint32_t> last = q.PopDue(tick);
    if (!last) continue;
    for (; next <= *last; ++next) {
      const int64_t held = tick - arrived[next];
      EXPECT_GE(held, kDelay - kTick / 2) << next;
      EXPECT_LT(held, kDelay + kTick / 2) << next;
      sum += held;
    }
  }
  // Arrivals fall anywhere within a tick, so the holds average the delay.
  EXPECT_NEAR(static_cast<double>(sum) / arrived.size(), kDelay, kTick / 8);
}

}  // namespace
}  // namespace tern::delayline
