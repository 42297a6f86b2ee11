#include "server/buffered_rounds.h"

#include <cmath>
#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

const absl::Time kBufferStart = absl::FromUnixSeconds(5000);

RoundPolicy FedBuffPolicy(int concurrency, int buffer) {
  RoundPolicy p;
  p.concurrency = concurrency;
  p.buffer = buffer;
  p.deadline = absl::Seconds(10);
  return p;
}

// An open version 1 with clients 0..9 available.
void OpenFirst(BufferedRounds& r) {
  r.SetAvailable({0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  ASSERT_THAT(r.Open(kBufferStart), IsOk());
}

bool Takes(BufferedRounds& r, int client, absl::Time now = kBufferStart) {
  return r.Take(client, now).train;
}

TEST(BufferedRounds, HandsOutAtMostConcurrencySlotsAndAReplyFreesOne) {
  BufferedRounds r(FedBuffPolicy(2, 10));
  EXPECT_FALSE(Takes(r, 1));  // nothing open yet
  OpenFirst(r);
  EXPECT_TRUE(Takes(r, 1));
  EXPECT_TRUE(Takes(r, 2));
  EXPECT_FALSE(Takes(r, 3));
  EXPECT_TRUE(Takes(r, 1));  // its own slot again (a fetch whose answer was lost)
  absl::StatusOr<ReplyDecision> d = r.Reply(1, 1, kBufferStart + absl::Seconds(1));
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->verdict, ReplyVerdict::kAccepted);
  EXPECT_TRUE(d->frees_slot);
  // The freed slot is set aside for client 3, the one waiting.
  EXPECT_FALSE(Takes(r, 1));
  EXPECT_TRUE(Takes(r, 3));
  EXPECT_EQ(r.in_flight(), 2u);
  EXPECT_FALSE(r.ToWake().has_value());  // every waiting fetch may have a new answer
}

TEST(BufferedRounds, AFreedSlotGoesToAWaitingClientDrawnUniformlyNotBackToItsHolder) {
  BufferedRounds r(FedBuffPolicy(1, 1000));
  OpenFirst(r);
  std::map<int, int> tasks;
  int holder = 0;
  ASSERT_TRUE(Takes(r, holder));
  absl::Time now = kBufferStart;
  for (int i = 0; i < 900; ++i) {
    now += absl::Milliseconds(10);
    for (int c = 0; c < 10; ++c) {
      if (c != holder) {
        EXPECT_FALSE(Takes(r, c, now));  // all wait
      }
    }
    ASSERT_THAT(r.Reply(holder, 1, now), IsOk());
    // The holder asks first, but the slot went to one of those waiting as it was freed.
    EXPECT_FALSE(Takes(r, holder, now));
    int next = -1;
    for (int c = 0; c < 10 && next < 0; ++c) {
      if (Takes(r, c, now)) next = c;
    }
    ASSERT_GE(next, 0);
    ASSERT_NE(next, holder);
    holder = next;
    ++tasks[holder];
  }
  // Uniform over the other 9 each time, so over all 10: 90 each, well inside 45..135.
  ASSERT_EQ(tasks.size(), 10u);
  for (const auto& [client, n] : tasks) {
    EXPECT_GT(n, 45) << client;
    EXPECT_LT(n, 135) << client;
  }
}

TEST(BufferedRounds, ASlotSetAsideForAWaiterThatNeverComesGoesToAnother) {
  BufferedRounds r(FedBuffPolicy(1, 1000));
  OpenFirst(r);
  ASSERT_TRUE(Takes(r, 0));
  EXPECT_FALSE(Takes(r, 1));
  ASSERT_THAT(r.Reply(0, 1, kBufferStart), IsOk());  // set aside for client 1, the one waiting
  EXPECT_FALSE(Takes(r, 2, kBufferStart + absl::Seconds(1)));
  // Client 1 never comes for it: 6 s on, it goes to one of those waiting then.
  EXPECT_TRUE(Takes(r, 2, kBufferStart + absl::Seconds(6)));
}

TEST(BufferedRounds, ClosesAfterKBufferedUpdatesOfAnyVersionScaledByStaleness) {
  BufferedRounds r(FedBuffPolicy(0, 2));
  OpenFirst(r);
  for (int c = 0; c < 4; ++c) ASSERT_TRUE(Takes(r, c));
  ASSERT_THAT(r.Reply(0, 1, kBufferStart), IsOk());
  EXPECT_FALSE(r.ShouldClose(kBufferStart));
  ASSERT_THAT(r.Reply(1, 1, kBufferStart), IsOk());
  EXPECT_TRUE(r.ShouldClose(kBufferStart));
  EXPECT_EQ(r.Close(), (std::vector<int>{0, 1}));
  ASSERT_THAT(r.Open(kBufferStart), IsOk());
  ASSERT_THAT(r.Open(kBufferStart), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(r.Close(), ::testing::IsEmpty());
  ASSERT_THAT(r.Open(kBufferStart), IsOk());
  // Clients 2 and 3 trained on version 1; version 3 is open: tau = 2.
  absl::StatusOr<ReplyDecision> d = r.Reply(2, 1, kBufferStart);
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->verdict, ReplyVerdict::kAcceptedStale);
  EXPECT_EQ(d->staleness, 2);
  EXPECT_DOUBLE_EQ(d->value_scale, 1 / std::sqrt(3.0));
  EXPECT_DOUBLE_EQ(d->weight_scale, 1.0);
  EXPECT_EQ(r.buffered(), 1u);
}

TEST(BufferedRounds, AClientTrainsOnOneVersionAgainWithTheNextAttempt) {
  BufferedRounds r(FedBuffPolicy(0, 10));
  OpenFirst(r);
  Rounds::Turn t = r.Take(4, kBufferStart);
  ASSERT_TRUE(t.train);
  EXPECT_EQ(t.attempt, 0u);
  t = r.Take(4, kBufferStart);  // the same task, asked again
  ASSERT_TRUE(t.train);
  EXPECT_EQ(t.attempt, 0u);
  ASSERT_THAT(r.Reply(4, 1, kBufferStart), IsOk());
  t = r.Take(4, kBufferStart);
  ASSERT_TRUE(t.train);
  EXPECT_EQ(t.attempt, 1u);
  ASSERT_THAT(r.Reply(4, 1, kBufferStart), IsOk());
  EXPECT_EQ(r.buffered(), 2u);
  EXPECT_THAT(r.Reply(4, 1, kBufferStart), StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST(BufferedRounds, RefusesRepliesWithoutATaskOrForVersionsThatNeverWere) {
  BufferedRounds r(FedBuffPolicy(0, 10));
  OpenFirst(r);
  EXPECT_THAT(r.Reply(5, 1, kBufferStart), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(r.Reply(5, 2, kBufferStart), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(r.Reply(5, 0, kBufferStart), StatusIs(absl::StatusCode::kOutOfRange));
  // A client that fetches again gave its older task up: its update for it is not wanted.
  ASSERT_TRUE(Takes(r, 5));
  r.Close();
  ASSERT_THAT(r.Open(kBufferStart), IsOk());
  ASSERT_TRUE(Takes(r, 5));
  EXPECT_THAT(r.Reply(5, 1, kBufferStart), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(r.Reply(5, 2, kBufferStart), IsOk());
}

TEST(BufferedRounds, ASlotHeldPastTheDeadlineGoesToAnotherAndItsUpdateIsDropped) {
  BufferedRounds r(FedBuffPolicy(1, 10));
  OpenFirst(r);
  ASSERT_TRUE(Takes(r, 1));
  EXPECT_FALSE(Takes(r, 2, kBufferStart + absl::Seconds(9)));
  EXPECT_TRUE(Takes(r, 2, kBufferStart + absl::Seconds(11)));
  absl::StatusOr<ReplyDecision> d = r.Reply(1, 1, kBufferStart + absl::Seconds(12));
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->verdict, ReplyVerdict::kDropped);
  EXPECT_FALSE(d->frees_slot);
  EXPECT_EQ(r.buffered(), 0u);
}

TEST(BufferedRounds, DropsUpdatesOlderThanTheStalenessBound) {
  RoundPolicy p = FedBuffPolicy(0, 1);
  p.staleness = *ParseStaleness("poly:a=0.5,max=1");
  BufferedRounds r(p);
  OpenFirst(r);
  ASSERT_TRUE(Takes(r, 1));
  ASSERT_TRUE(Takes(r, 2));
  for (int v = 0; v < 2; ++v) {
    r.Close();
    ASSERT_THAT(r.Open(kBufferStart), IsOk());
  }
  absl::StatusOr<ReplyDecision> d = r.Reply(1, 1, kBufferStart);
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->verdict, ReplyVerdict::kDropped);
  EXPECT_EQ(d->staleness, 2);
  EXPECT_TRUE(d->frees_slot);
}

TEST(BufferedRounds, ASpentClientGetsNoOtherTaskOnThatVersion) {
  BufferedRounds r(FedBuffPolicy(0, 10));
  OpenFirst(r);
  ASSERT_TRUE(Takes(r, 3));
  r.Spend(3, 1);
  EXPECT_FALSE(Takes(r, 3));
  EXPECT_THAT(r.Reply(3, 1, kBufferStart), StatusIs(absl::StatusCode::kFailedPrecondition));
  r.Close();
  ASSERT_THAT(r.Open(kBufferStart), IsOk());
  EXPECT_TRUE(Takes(r, 3));
}

TEST(BufferedRounds, UnreplyGivesTheSlotBackForTheRetry) {
  BufferedRounds r(FedBuffPolicy(1, 10));
  OpenFirst(r);
  ASSERT_TRUE(Takes(r, 1));
  ASSERT_THAT(r.Reply(1, 1, kBufferStart), IsOk());
  r.Unreply(1, 1);
  EXPECT_EQ(r.buffered(), 0u);
  EXPECT_FALSE(Takes(r, 2));
  EXPECT_THAT(r.Reply(1, 1, kBufferStart), IsOk());
}

// The slot a reply freed went to a waiter; the reply taken back (its update could not be made
// durable) takes the slot back from the offer, so one client trains at a time, not two.
TEST(BufferedRounds, UnreplyWithdrawsTheOfferOfTheSlotItTakesBack) {
  BufferedRounds r(FedBuffPolicy(1, 10));
  OpenFirst(r);
  ASSERT_TRUE(Takes(r, 1));
  EXPECT_FALSE(Takes(r, 2));                         // waiting for a slot
  ASSERT_THAT(r.Reply(1, 1, kBufferStart), IsOk());  // its slot set aside for client 2
  r.Unreply(1, 1);
  EXPECT_EQ(r.in_flight(), 1u);
  EXPECT_FALSE(Takes(r, 2));
  EXPECT_EQ(r.in_flight(), 1u);
  EXPECT_THAT(r.Reply(1, 1, kBufferStart), IsOk());  // the retry
  EXPECT_TRUE(Takes(r, 2));
  EXPECT_EQ(r.in_flight(), 1u);
}

// A reply taken back and brought again is one client's training time to the learned deadline,
// measured to the reply that was kept.
TEST(BufferedRounds, AReplyTakenBackIsLearnedOnceFromItsRetry) {
  RoundPolicy p = FedBuffPolicy(0, 10);
  p.deadline_k = 3;
  p.deadline_floor = absl::Milliseconds(100);
  BufferedRounds r(p);
  OpenFirst(r);
  ASSERT_TRUE(Takes(r, 1));
  ASSERT_THAT(r.Reply(1, 1, kBufferStart + absl::Seconds(2)), IsOk());
  EXPECT_EQ(r.deadline_fit().samples, 1u);
  r.Unreply(1, 1);
  EXPECT_EQ(r.deadline_fit().samples, 0u);
  ASSERT_THAT(r.Reply(1, 1, kBufferStart + absl::Seconds(3)), IsOk());
  EXPECT_EQ(r.deadline_fit().samples, 1u);
  EXPECT_EQ(r.deadline_fit().median, absl::Seconds(3));
}

TEST(BufferedRounds, ComesBackFromItsCheckpointWithSlotsAndBuffer) {
  BufferedRounds r(FedBuffPolicy(0, 3));
  OpenFirst(r);
  for (int c = 0; c < 3; ++c) ASSERT_TRUE(Takes(r, c));
  ASSERT_THAT(r.Reply(0, 1, kBufferStart), IsOk());
  internal::AggregatorCheckpoint ckpt;
  ckpt.set_round(0);  // versions completed
  r.Save(&ckpt);
  EXPECT_EQ(ckpt.in_flight_size(), 2);
  EXPECT_EQ(ckpt.buffered_size(), 1);
  internal::LoggedUpdate logged;  // client 1's update, logged after the snapshot
  logged.set_client(1);
  logged.set_round(1);
  BufferedRounds back(FedBuffPolicy(0, 3));
  back.Restore(ckpt, {logged}, kBufferStart + absl::Hours(1));
  EXPECT_TRUE(back.open());
  EXPECT_EQ(back.round(), 1);
  EXPECT_EQ(back.buffered(), 2u);
  EXPECT_EQ(back.in_flight(), 1u);
  EXPECT_THAT(back.Reply(1, 1, kBufferStart), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(back.Reply(2, 1, kBufferStart + absl::Hours(1)), IsOk());
  EXPECT_TRUE(back.ShouldClose(kBufferStart));
  // A slot taken after the snapshot: one update from before the restart, once.
  back.Close();
  ASSERT_THAT(back.Open(kBufferStart), StatusIs(absl::StatusCode::kFailedPrecondition));
  back.SetAvailable({7});
  ASSERT_THAT(back.Open(kBufferStart), IsOk());
  EXPECT_THAT(back.Reply(7, 1, kBufferStart), IsOk());
  ASSERT_TRUE(Takes(back, 7));
  EXPECT_THAT(back.Reply(7, 2, kBufferStart), IsOk());
  EXPECT_THAT(back.Reply(8, 2, kBufferStart), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(back.Reply(8, 1, kBufferStart), IsOk());
  EXPECT_THAT(back.Reply(8, 1, kBufferStart), StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST(Staleness, ParsesTheFunctionsAndTheirBound) {
  EXPECT_DOUBLE_EQ(ParseStaleness("poly")->Weight(3), 0.5);
  EXPECT_DOUBLE_EQ(ParseStaleness("poly:a=1")->Weight(3), 0.25);
  EXPECT_DOUBLE_EQ(ParseStaleness("const")->Weight(100), 1.0);
  const Staleness h = *ParseStaleness("hinge:a=1,b=2,max=9");
  EXPECT_DOUBLE_EQ(h.Weight(2), 1.0);
  EXPECT_DOUBLE_EQ(h.Weight(4), 1.0 / 3);
  EXPECT_EQ(h.max, 9);
  for (const char* bad : {"cubic", "poly:a=-1", "poly:b=1", "hinge:a=x", "const:max=-2", ""}) {
    EXPECT_THAT(ParseStaleness(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

}  // namespace
}  // namespace tern
