#include "server/round.h"

#include <algorithm>
#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

std::set<int> Range(int n) {
  std::set<int> s;
  for (int i = 0; i < n; ++i) s.insert(i);
  return s;
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(RoundTracker, SamplesKDistinctClientsReproduciblyAndDifferentlyEachRound) {
  RoundPolicy p;
  p.clients_per_round = 10;
  RoundTracker a(p), b(p);
  a.SetAvailable(Range(100));
  b.SetAvailable(Range(100));
  auto r1 = a.Open(kT0);
  ASSERT_THAT(r1, IsOk());
  EXPECT_EQ(std::set<int>(r1->begin(), r1->end()).size(), 10u);
  EXPECT_EQ(*b.Open(kT0), *r1);  // same seed, same draw
  a.Close();
  auto r2 = a.Open(kT0);
  EXPECT_NE(*r2, *r1);
  EXPECT_EQ(a.round(), 2);
  EXPECT_THAT(a.Open(kT0), StatusIs(absl::StatusCode::kFailedPrecondition));  // still open
  RoundTracker few(p);
  few.SetAvailable({3, 5});
  EXPECT_EQ(*few.Open(kT0), (std::vector<int>{3, 5}));
  RoundTracker none(p);
  EXPECT_THAT(none.Open(kT0), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(RoundTracker, NextRoundClientsIsHowManyOpenSamples) {
  RoundPolicy p;
  p.clients_per_round = 10;
  for (int available : {1, 3, 10, 40}) {
    RoundTracker t(p);
    t.SetAvailable(Range(available));
    const uint32_t next = t.NextRoundClients(static_cast<size_t>(available));
    EXPECT_EQ(next, static_cast<uint32_t>(std::min(available, 10)));
    ASSERT_THAT(t.Open(kT0), IsOk());
    EXPECT_EQ(t.round_clients(), next) << available << " available";
  }
}

TEST(RoundTracker, ScoreSamplingFavoursHighScores) {
  RoundPolicy p;
  p.clients_per_round = 5;
  p.sampling = RoundPolicy::Sampling::kScore;
  RoundTracker t(p);
  t.SetAvailable(Range(50));
  for (int c = 0; c < 10; ++c) t.SetScore(c, 20.0);  // clients 0..9 score 20, the rest 1
  int high = 0, total = 0;
  for (int r = 0; r < 400; ++r) {
    const std::vector<int> picked = *t.Open(kT0);
    for (int c : picked) {
      high += c < 10;
      ++total;
    }
    t.Close();
  }
  // Uniform would give 20 %; with weight 20 vs 1 they take most of the slots.
  EXPECT_GT(static_cast<double>(high) / total, 0.6);
}

TEST(RoundTracker, RepliesAreCheckedAgainstTheRoundAndTheSample) {
  RoundPolicy p;
  p.clients_per_round = 3;
  RoundTracker t(p);
  t.SetAvailable(Range(10));
  auto s = *t.Open(kT0);
  int outsider = 0;
  while (std::count(s.begin(), s.end(), outsider)) ++outsider;
  EXPECT_THAT(t.Reply(outsider, 1, kT0), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(t.Reply(s[0], 2, kT0), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(t.Reply(s[0], 0, kT0), StatusIs(absl::StatusCode::kOutOfRange));
  auto d = t.Reply(s[0], 1, kT0);
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->verdict, ReplyVerdict::kAccepted);
  EXPECT_THAT(t.Reply(s[0], 1, kT0), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(t.replies(), 1);
}

TEST(RoundTracker, ASpentTurnGetsNoSecondReplyAndTheRoundStopsWaitingForIt) {
  RoundPolicy p;
  p.clients_per_round = 3;
  p.min_replies = 3;
  p.deadline = absl::Seconds(60);
  RoundTracker t(p);
  t.SetAvailable(Range(3));
  auto s = *t.Open(kT0);
  for (int c : s) EXPECT_TRUE(t.Awaits(c));
  t.Spend(s[0], 1);
  t.Spend(s[1], 2);  // another round: nothing
  EXPECT_FALSE(t.Awaits(s[0]));
  EXPECT_TRUE(t.Awaits(s[1]));
  EXPECT_THAT(t.Reply(s[0], 1, kT0), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(t.Reply(s[1], 1, kT0), IsOk());
  t.Spend(s[1], 1);  // replied already: its reply stands
  EXPECT_FALSE(t.Awaits(s[1]));
  EXPECT_EQ(t.CloseTime(), kT0 + absl::Seconds(60));
  ASSERT_THAT(t.Reply(s[2], 1, kT0 + absl::Seconds(1)), IsOk());
  // Everyone replied or spent their turn: it closes now, with the replies.
  EXPECT_TRUE(t.ShouldClose(kT0 + absl::Seconds(1)));
  EXPECT_EQ(t.Close().size(), 2u);
  // The next round gives everyone a turn again.
  absl::StatusOr<std::vector<int>> next = t.Open(kT0 + absl::Seconds(2));
  ASSERT_THAT(next, IsOk());
  for (int c : *next) EXPECT_TRUE(t.Awaits(c));
}

TEST(RoundTracker, ClosesAtMinRepliesPlusGraceOrAtTheDeadline) {
  RoundPolicy p;
  p.clients_per_round = 4;
  p.min_replies = 2;
  p.grace = absl::Seconds(3);
  p.deadline = absl::Seconds(60);
  RoundTracker t(p);
  t.SetAvailable(Range(4));
  auto s = *t.Open(kT0);
  EXPECT_EQ(t.CloseTime(), kT0 + absl::Seconds(60));
  ASSERT_THAT(t.Reply(s[0], 1, kT0 + absl::Seconds(5)), IsOk());
  EXPECT_FALSE(t.ShouldClose(kT0 + absl::Seconds(30)));
  ASSERT_THAT(t.Reply(s[1], 1, kT0 + absl::Seconds(10)), IsOk());
  EXPECT_EQ(t.CloseTime(), kT0 + absl::Seconds(13));
  EXPECT_FALSE(t.ShouldClose(kT0 + absl::Seconds(12)));
  EXPECT_TRUE(t.ShouldClose(kT0 + absl::Seconds(13)));
  // Everyone answered: no need to wait for the grace.
  ASSERT_THAT(t.Reply(s[2], 1, kT0 + absl::Seconds(11)), IsOk());
  ASSERT_THAT(t.Reply(s[3], 1, kT0 + absl::Seconds(11)), IsOk());
  EXPECT_TRUE(t.ShouldClose(kT0 + absl::Seconds(11)));
  EXPECT_EQ(t.Close().size(), 4u);
  // A dead round: nobody answers, it closes at the deadline with nobody.
  auto s2 = *t.Open(kT0 + absl::Seconds(100));
  EXPECT_FALSE(t.ShouldClose(kT0 + absl::Seconds(159)));
  EXPECT_TRUE(t.ShouldClose(kT0 + absl::Seconds(160)));
  EXPECT_TRUE(t.Close().empty());
}

// --learned_deadline_k: once replies have come in for a while, a round waits for its straggler
// only as long as the arrivals say (median + k spreads), not the fixed deadline; the straggler's
// late reply counts for the next deadline too.
TEST(RoundTracker, ALearnedDeadlineClosesARoundOnItsStragglerAtTheArrivalsMedianPlusKSpreads) {
  RoundPolicy p;
  p.clients_per_round = 4;
  p.min_replies = 4;
  p.deadline = absl::Seconds(60);
  p.deadline_k = 3;
  p.deadline_floor = absl::Milliseconds(500);
  RoundTracker t(p);
  t.SetAvailable(Range(4));
  absl::Time now = kT0;
  for (int r = 1; r <= 3; ++r) {
    const std::vector<int> s = *t.Open(now);
    if (r <= 2) {
      EXPECT_EQ(t.deadline(), absl::Seconds(60)) << "fewer than 8 arrivals, round " << r;
    }
    for (int i = 0; i < 4; ++i) {
      ASSERT_THAT(t.Reply(s[i], r, now + absl::Milliseconds(1000 + 100 * i)), IsOk());
    }
    ASSERT_TRUE(t.ShouldClose(now + absl::Milliseconds(1300)));
    t.Close();
    now += absl::Seconds(2);
  }
  // Arrivals 1.0 .. 1.3 s, three times: median 1.15 s, MAD 0.1 s.
  const std::vector<int> s = *t.Open(now);
  EXPECT_NEAR(absl::ToDoubleSeconds(t.deadline()), 1.15 + 3 * 1.4826 * 0.1, 1e-6);
  for (int i = 0; i < 3; ++i) {
    ASSERT_THAT(t.Reply(s[i], 4, now + absl::Milliseconds(1000 + 100 * i)), IsOk());
  }
  EXPECT_FALSE(t.ShouldClose(now + absl::Milliseconds(1500)));
  EXPECT_TRUE(t.ShouldClose(now + absl::Milliseconds(1600)));  // not at 60 s
  EXPECT_EQ(t.Close().size(), 3u);
  // The straggler answers at 30 s: dropped, and its arrival is counted once.
  EXPECT_EQ(t.deadline_fit().samples, 15u);
  EXPECT_EQ(::tern::testing::ValueOrFailure(t.Reply(s[3], 4, now + absl::Seconds(30))).verdict,
            ReplyVerdict::kDropped);
  EXPECT_EQ(t.deadline_fit().samples, 16u);
  (void)t.Reply(s[3], 4, now + absl::Seconds(31));
  EXPECT_EQ(t.deadline_fit().samples, 16u);
}

TEST(RoundTracker, LateRepliesAreDroppedOrStalenessWeightedNeverMixedIntoTheOpenRound) {
  RoundPolicy drop;
  drop.clients_per_round = 2;
  drop.min_replies = 1;
  RoundTracker d(drop);
  d.SetAvailable(Range(2));
  d.Open(kT0).IgnoreError();
  d.Close();
  d.Open(kT0).IgnoreError();
  auto late = d.Reply(0, 1, kT0);
  ASSERT_THAT(late, IsOk());
  EXPECT_EQ(late->verdict, ReplyVerdict::kDropped);
  EXPECT_EQ(d.replies(), 0);  // round 2 did not count it

  RoundPolicy stale = drop;
  stale.staleness_decay = 0.5;
  stale.max_staleness = 2;
  RoundTracker s(stale);
  s.SetAvailable(Range(2));
  for (int r = 0; r < 3; ++r) {
    s.Open(kT0).IgnoreError();
    s.Close();
  }
  s.Open(kT0).IgnoreError();  // round 4 open; 3 is age 1, 2 is age 2, 1 is too old
  auto a1 = s.Reply(0, 3, kT0);
  ASSERT_THAT(a1, IsOk());
  EXPECT_EQ(a1->verdict, ReplyVerdict::kAcceptedStale);
  EXPECT_DOUBLE_EQ(a1->weight_scale, 0.5);
  auto a2 = s.Reply(1, 2, kT0);
  ASSERT_THAT(a2, IsOk());
  EXPECT_DOUBLE_EQ(a2->weight_scale, 0.25);
  EXPECT_EQ(s.Reply(0, 1, kT0)->verdict, ReplyVerdict::kDropped);
  EXPECT_THAT(s.Reply(0, 3, kT0), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(s.replies(), 0);
}

}  // namespace
}  // namespace tern
