#include "worker/gossip_inbox.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

TEST(GossipInbox, TakeWaitsForEveryListedSenderThenClosesTheRound) {
  GossipInbox inbox(4);
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_THAT(inbox.Put(0, 2, GossipMessage{}), IsOk());
  });
  ASSERT_THAT(inbox.Put(0, 1, GossipMessage{}), IsOk());
  auto got = inbox.Take(0, {1, 2}, {1, 2}, absl::Now() + absl::Seconds(10));
  late.join();
  EXPECT_EQ(got.size(), 2u);
  EXPECT_EQ(inbox.floor(), 1);
  EXPECT_THAT(inbox.Put(0, 1, GossipMessage{}), StatusIs(absl::StatusCode::kOutOfRange));
}

TEST(GossipInbox, DeadlineReturnsWhatArrived) {
  GossipInbox inbox(4);
  ASSERT_THAT(inbox.Put(0, 1, GossipMessage{}), IsOk());
  const absl::Time t0 = absl::Now();
  auto got = inbox.Take(0, {1, 2}, {1, 2}, t0 + absl::Milliseconds(100));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(90));
  EXPECT_EQ(got.size(), 1u);
  EXPECT_EQ(got.count(1), 1u);
}

TEST(GossipInbox, AwaitSaysWhoIsMissingAndLeavesTheRoundOpen) {
  GossipInbox inbox(4);
  ASSERT_THAT(inbox.Put(0, 1, GossipMessage{}), IsOk());
  EXPECT_EQ(inbox.Await(0, {1, 2, 3}, absl::Now() + absl::Milliseconds(20)),
            (std::vector<int>{2, 3}));
  ASSERT_THAT(inbox.Put(0, 3, GossipMessage{}), IsOk());  // the round is still open
  inbox.GiveUp(0, 2);
  EXPECT_TRUE(inbox.Await(0, {1, 2, 3}, absl::Now() + absl::Seconds(30)).empty());
  EXPECT_EQ(inbox.Take(0, {1, 3}, {1, 2, 3}, absl::Now()).size(), 2u);
}

TEST(GossipInbox, GiveUpStopsTheWaitForThatSender) {
  GossipInbox inbox(4);
  inbox.GiveUp(0, 2);
  const absl::Time t0 = absl::Now();
  auto got = inbox.Take(0, {2}, {2}, t0 + absl::Seconds(30));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_TRUE(got.empty());
}

// A peer replaced by another process: a Take already waiting for it stops at once, what it sent
// before is still taken, and rounds past the one given up through wait for it again. A worker
// never heard from (one starting for the first time) is still waited for.
TEST(GossipInbox, AReplacedSenderIsNotWaitedForInTheRoundsUnderWay) {
  GossipInbox inbox(4);
  ASSERT_THAT(inbox.Put(0, 2, GossipMessage{}), IsOk());
  EXPECT_EQ(inbox.Take(0, {2}, {2}, absl::Now() + absl::Seconds(30)).size(), 1u);
  ASSERT_THAT(inbox.Put(2, 3, GossipMessage{}), IsOk());
  std::thread replaced([&] {
    absl::SleepFor(absl::Milliseconds(50));
    inbox.Replaced(2, 2);
  });
  const absl::Time t0 = absl::Now();
  auto got = inbox.Take(1, {2}, {2}, t0 + absl::Seconds(30));
  replaced.join();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_TRUE(got.empty());
  got = inbox.Take(2, {2, 3}, {2, 3}, absl::Now() + absl::Seconds(30));
  EXPECT_EQ(got.size(), 1u);
  EXPECT_EQ(got.count(3), 1u);
  EXPECT_EQ(inbox.Await(3, {2}, absl::Now() + absl::Milliseconds(20)), (std::vector<int>{2}));
  inbox.Replaced(1, 3);  // never heard from
  EXPECT_EQ(inbox.Await(3, {1}, absl::Now() + absl::Milliseconds(20)), (std::vector<int>{1}));
}

TEST(GossipInbox, ASenderFarAheadIsNotWaitedForInRoundsItHasPassed) {
  GossipInbox inbox(32);
  // Worker 1 went on without us (its half of a split ring ran faster): its message for round
  // 40 is refused as too far ahead, but it says worker 1 will not send for round 0 any more.
  // (The engine checks such a message before it notes it: a malformed one says nothing.)
  EXPECT_THAT(inbox.CheckRound(40), StatusIs(absl::StatusCode::kOutOfRange));
  inbox.Note(40, 1);
  ASSERT_THAT(inbox.Put(0, 2, GossipMessage{}), IsOk());
  const absl::Time t0 = absl::Now();
  auto got = inbox.Take(0, {1, 2}, {1, 2}, t0 + absl::Seconds(30));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(got.size(), 1u);
  EXPECT_EQ(got.count(2), 1u);
  // Up to kPassedBy rounds short of it, not one round closer.
  for (int64_t r = 1; r < 40 - GossipInbox::kPassedBy + 1; ++r) {
    EXPECT_TRUE(inbox.Take(r, {1}, {1}, absl::Now() + absl::Seconds(30)).empty());
  }
  EXPECT_EQ(inbox.floor(), 40 - GossipInbox::kPassedBy + 1);
}

TEST(GossipInbox, ANeighbourOneOrTwoRoundsAheadIsStillWaitedFor) {
  GossipInbox inbox(32);
  ASSERT_THAT(inbox.Put(2, 1, GossipMessage{}), IsOk());  // its round-0 message is late
  const absl::Time t0 = absl::Now();
  auto got = inbox.Take(0, {1}, {1}, t0 + absl::Milliseconds(100));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(90));
  EXPECT_TRUE(got.empty());
}

// Two neighbours that resume one round apart after drifting beyond the window: the message the
// one ahead sent for this round was refused long ago, so it is not waited for (it would cost a
// round deadline, and the same again on the other side, round after round).
TEST(GossipInbox, AMessageRefusedAsTooFarAheadIsNotWaitedForWhenItsRoundComes) {
  GossipInbox inbox(32);
  EXPECT_THAT(inbox.Put(40, 1, GossipMessage{}), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(inbox.CheckRound(41), StatusIs(absl::StatusCode::kOutOfRange));
  inbox.Note(41, 1);  // checked by the engine, then refused
  inbox.Skip(40);
  ASSERT_THAT(inbox.Put(42, 1, GossipMessage{}), IsOk());  // it is 2 rounds ahead now
  const absl::Time t0 = absl::Now();
  EXPECT_TRUE(inbox.Take(40, {1}, {1}, t0 + absl::Seconds(30)).empty());
  EXPECT_TRUE(inbox.Take(41, {1}, {1}, t0 + absl::Seconds(30)).empty());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(inbox.Take(42, {1}, {1}, t0 + absl::Seconds(30)).size(), 1u);
}

// Rounds H steps apart (local SGD, diloco): a neighbour one or two periods (H = 50 steps)
// ahead is neither refused nor taken for one that went on without this worker; three periods
// ahead, it is.
TEST(GossipInbox, ItsWindowAndPatienceCountInRoundsOfSeveralSteps) {
  GossipInbox inbox(/*max_rounds_ahead=*/4, /*steps_per_round=*/50);
  EXPECT_THAT(inbox.Put(149, 1, GossipMessage{}), IsOk());
  EXPECT_THAT(inbox.Put(199, 1, GossipMessage{}), IsOk());
  EXPECT_THAT(inbox.Put(200, 1, GossipMessage{}), StatusIs(absl::StatusCode::kOutOfRange));
  const absl::Time t0 = absl::Now();
  EXPECT_TRUE(inbox.Take(49, {1}, {1}, t0 + absl::Seconds(30)).empty());  // 150 steps behind
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  const absl::Time t1 = absl::Now();
  EXPECT_TRUE(inbox.Take(99, {1}, {1}, t1 + absl::Milliseconds(100)).empty());  // 100 behind
  EXPECT_GE(absl::Now() - t1, absl::Milliseconds(90));
  EXPECT_EQ(inbox.Take(149, {1}, {1}, absl::Now() + absl::Seconds(5)).size(), 1u);
}

TEST(GossipInbox, WindowDuplicatesSkipAndClose) {
  GossipInbox inbox(3);
  EXPECT_THAT(inbox.Put(2, 1, GossipMessage{}), IsOk());
  EXPECT_THAT(inbox.Put(3, 1, GossipMessage{}), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(inbox.Put(2, 1, GossipMessage{}), StatusIs(absl::StatusCode::kAlreadyExists));
  inbox.Skip(2);  // rounds 0 and 1 did not communicate
  EXPECT_EQ(inbox.floor(), 2);
  auto got = inbox.Take(2, {1}, {1}, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(got.size(), 1u);
  inbox.Close();
  EXPECT_THAT(inbox.Put(3, 1, GossipMessage{}), StatusIs(absl::StatusCode::kCancelled));
  const absl::Time t0 = absl::Now();
  inbox.Take(3, {1}, {1}, t0 + absl::Seconds(30));  // returns at once once closed
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

}  // namespace
}  // namespace tern
