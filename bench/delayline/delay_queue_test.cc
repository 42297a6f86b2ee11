#include "bench/delayline/delay_queue.h"

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

}  // namespace
}  // namespace tern::delayline
