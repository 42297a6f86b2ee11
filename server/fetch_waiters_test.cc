#include "server/fetch_waiters.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

// A parked wait whose alarm, if nothing wakes it, fires an hour from now.
struct Parked {
  std::shared_ptr<FetchWaiters::Waiter> waiter = std::make_shared<FetchWaiters::Waiter>();
  absl::Notification ran;
  std::atomic<bool> fired_ok{false};

  void Set() {
    waiter->alarm.Set(absl::ToChronoTime(absl::Now() + absl::Hours(1)), [this](bool ok) {
      fired_ok = ok;
      ran.Notify();
    });
  }
};

TEST(FetchWaiters, WakeAllRunsEveryParkedCallbackAtOnce) {
  FetchWaiters waiters;
  std::vector<std::unique_ptr<Parked>> parked;
  for (int i = 0; i < 5; ++i) {
    parked.push_back(std::make_unique<Parked>());
    parked.back()->Set();
    ASSERT_TRUE(
        waiters.Park(static_cast<uint32_t>(i), parked.back()->waiter, waiters.generation()));
  }
  EXPECT_EQ(waiters.parked(), 5u);
  waiters.WakeAll();
  for (auto& p : parked) {
    EXPECT_TRUE(p->ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_FALSE(p->fired_ok);  // cancelled, not expired
  }
  EXPECT_EQ(waiters.parked(), 0u);
}

TEST(FetchWaiters, WakeWakesOnlyTheGivenClients) {
  FetchWaiters waiters;
  std::vector<std::unique_ptr<Parked>> parked;
  for (int i = 0; i < 4; ++i) {
    parked.push_back(std::make_unique<Parked>());
    parked.back()->Set();
    ASSERT_TRUE(
        waiters.Park(static_cast<uint32_t>(i), parked.back()->waiter, waiters.generation()));
  }
  waiters.Wake({1, 3, 99});  // a round sampled clients 1, 3 and one not waiting
  EXPECT_TRUE(parked[1]->ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(parked[3]->ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(parked[0]->ran.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  EXPECT_FALSE(parked[2]->ran.HasBeenNotified());
  EXPECT_EQ(waiters.parked(), 2u);
  waiters.WakeAll();  // the run is done: everyone
  EXPECT_TRUE(parked[0]->ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(parked[2]->ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(FetchWaiters, AnEventBetweenLookingAndParkingIsNotLost) {
  FetchWaiters waiters;
  const uint64_t seen = waiters.generation();
  waiters.WakeAll();  // the round opened after the call asked, before it parked
  Parked p;
  p.Set();
  EXPECT_FALSE(waiters.Park(3, p.waiter, seen));  // the caller asks again instead of sleeping
  p.waiter->alarm.Cancel();
  EXPECT_TRUE(p.ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(FetchWaiters, CallsThatEndedAreDroppedNotWoken) {
  FetchWaiters waiters;
  for (int i = 0; i < 500; ++i) {
    Parked p;  // parks, then its alarm fires and the call ends
    p.waiter->alarm.Set(absl::ToChronoTime(absl::Now()), [&p](bool) { p.ran.Notify(); });
    ASSERT_TRUE(waiters.Park(7, p.waiter, waiters.generation()));
    ASSERT_TRUE(p.ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
    p.waiter.reset();
  }
  EXPECT_EQ(waiters.parked(), 0u);
  waiters.WakeAll();  // nothing alive to cancel
}

}  // namespace
}  // namespace tern
