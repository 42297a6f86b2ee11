#include "worker/lane.h"

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(PeerHealth, ANeighbourIsWaitedForWhileItIsReachableOrRefusesAndHeardOnceItsMessageCame) {
  PeerHealth h(5);
  const std::vector<int> nbrs = {1, 2, 3, 4};
  const std::map<int, absl::Status> results = {
      {1, absl::OkStatus()},                                 // took our message
      {2, absl::UnavailableError("connection refused")},     // gone
      {3, absl::InvalidArgumentError("round 7 is closed")},  // alive, behind or ahead
  };                                                         // 4: push still running
  std::map<int, GossipMessage> received;
  received[1] = GossipMessage();
  uint64_t sent_to = 0;
  std::vector<int> mixed, dropped;
  h.Judge(0, 7, nbrs, results, received, &sent_to, &mixed, &dropped);
  EXPECT_EQ(sent_to, 1u);
  EXPECT_THAT(mixed, ElementsAre(1));
  EXPECT_THAT(dropped, ElementsAre(2, 3, 4));
  EXPECT_TRUE(h.up(1) && h.heard(1));
  EXPECT_FALSE(h.up(2));
  EXPECT_TRUE(h.up(3)) << "a refusal says it is alive: worth waiting for";
  EXPECT_FALSE(h.up(4)) << "a push past its deadline counts as unreachable";
  EXPECT_FALSE(h.heard(3));
  // Its message coming back brings a neighbour up again.
  std::map<int, GossipMessage> back;
  back[2] = GossipMessage();
  mixed.clear();
  dropped.clear();
  h.Judge(0, 8, {2}, {{2, absl::DeadlineExceededError("slow")}}, back, &sent_to, &mixed, &dropped);
  EXPECT_TRUE(h.up(2) && h.heard(2));
  EXPECT_THAT(mixed, ElementsAre(2));
  EXPECT_THAT(dropped, IsEmpty());
}

// Pushes to a worker never heard from retry Unavailable (it may be starting up); to one heard from,
// they are made once; to one heard from that said it listens again (restarted), they wait for a
// connection (ours to it may still be backing off) and take its answer as final (Unavailable: it
// sits the round out) until its next message comes.
TEST(PeerHealth, APushRetriesANewPeerWaitsForOneComingBackAndIsMadeOnceOtherwise) {
  using Reach = PeerTransport::Reach;
  PeerHealth h(3);
  EXPECT_EQ(h.ReachOf(1), Reach::kRetryUnavailable);
  std::map<int, GossipMessage> from1;
  from1[1] = GossipMessage();
  uint64_t sent_to = 0;
  std::vector<int> mixed, dropped;
  h.Judge(0, 0, {1}, {{1, absl::OkStatus()}}, from1, &sent_to, &mixed, &dropped);
  EXPECT_EQ(h.ReachOf(1), Reach::kOnce);
  h.Judge(0, 1, {1}, {{1, absl::UnavailableError("connection refused")}}, {}, &sent_to, &mixed,
          &dropped);
  EXPECT_EQ(h.ReachOf(1), Reach::kOnce) << "a peer gone is not retried every round";
  h.Returning(1);
  EXPECT_EQ(h.ReachOf(1), Reach::kWaitForReady);
  h.Judge(0, 2, {1}, {{1, absl::UnavailableError("sits round 2 out")}}, {}, &sent_to, &mixed,
          &dropped);
  EXPECT_EQ(h.ReachOf(1), Reach::kWaitForReady) << "until its first message";
  h.MarkUp(1);
  h.Judge(0, 3, {1}, {{1, absl::OkStatus()}}, from1, &sent_to, &mixed, &dropped);
  EXPECT_EQ(h.ReachOf(1), Reach::kOnce);
  h.Returning(2);
  EXPECT_EQ(h.ReachOf(2), Reach::kRetryUnavailable) << "never heard from: starting up";
}

// Keeps each push's callback, unanswered until the test says.
class HeldTransport final : public PeerTransport {
 public:
  struct Sent {
    int to;
    absl::Time deadline;
    Reach reach;
    std::function<void(absl::Status)> done;
  };
  std::vector<Sent> sent;
  void Send(int to, Chunks, absl::Time deadline, Reach reach,
            std::function<void(absl::Status)> done) override {
    sent.push_back({to, deadline, reach, std::move(done)});
  }
};

Lane LaneOf(int num_workers) {
  Lane lane;
  lane.inbox = std::make_shared<GossipInbox>(32, 1);
  lane.last_push.resize(static_cast<size_t>(num_workers));
  lane.push_before.resize(static_cast<size_t>(num_workers));
  lane.held.resize(static_cast<size_t>(num_workers));
  return lane;
}

// Round `step`'s message pushed to `nbrs`, with deadlines `step` s past t0 (ten more lasting).
void PushRound(Lane& lane, int64_t step, std::vector<int> nbrs, absl::Time t0, const PeerHealth& h,
               HeldTransport& transport) {
  InFlight r;
  r.step = step;
  r.nbrs = std::move(nbrs);
  r.deadline = t0 + absl::Seconds(step);
  r.lasting_deadline = r.deadline + absl::Seconds(10);
  lane.Push(r, std::make_shared<const std::vector<v1::BundleChunk>>(), h, &transport);
}

// A neighbour that is down gets one push at a time, with the round's deadline; one rejoining
// (heard from before, listening again) gets its pushes with the longer deadline and up to two in
// flight: it mixes those rounds later, from its inbox, while its state comes over the same link.
// A round's push that waits for those is made once one ends, in order.
TEST(Lane, ARejoiningNeighboursPushesOutlastTheRoundTwoAtATime) {
  PeerHealth h(3);
  uint64_t sent_to = 0;
  std::vector<int> mixed, dropped;
  std::map<int, GossipMessage> heard;
  heard[1] = GossipMessage();
  heard[2] = GossipMessage();
  h.Judge(0, 0, {1, 2}, {{1, absl::OkStatus()}, {2, absl::OkStatus()}}, heard, &sent_to, &mixed,
          &dropped);
  // Both die; worker 2 comes back and asks where the group is.
  const absl::Status gone = absl::UnavailableError("connection refused");
  h.Judge(0, 1, {1, 2}, {{1, gone}, {2, gone}}, {}, &sent_to, &mixed, &dropped);
  h.Returning(2);
  Lane lane = LaneOf(3);
  HeldTransport transport;
  const absl::Time t0 = absl::Now() + absl::Hours(1);
  for (int64_t step = 2; step < 5; ++step) PushRound(lane, step, {1, 2}, t0, h, transport);
  // Worker 1: round 2's push only (a probe). Worker 2: rounds 2 and 3, not 4 while both run.
  ASSERT_EQ(transport.sent.size(), 3u);
  EXPECT_EQ(transport.sent[0].to, 1);
  EXPECT_EQ(transport.sent[0].deadline, t0 + absl::Seconds(2));
  EXPECT_EQ(transport.sent[1].to, 2);
  EXPECT_EQ(transport.sent[1].reach, PeerTransport::Reach::kWaitForReady);
  EXPECT_EQ(transport.sent[1].deadline, t0 + absl::Seconds(12));
  EXPECT_EQ(transport.sent[2].to, 2);
  EXPECT_EQ(transport.sent[2].deadline, t0 + absl::Seconds(13));
  // Round 2's push to worker 2 ends: at round 5, round 4's goes, and round 5's waits.
  transport.sent[1].done(absl::OkStatus());
  PushRound(lane, 5, {1, 2}, t0, h, transport);
  ASSERT_EQ(transport.sent.size(), 4u);
  EXPECT_EQ(transport.sent[3].to, 2);
  EXPECT_EQ(transport.sent[3].deadline, t0 + absl::Seconds(14)) << "round 4's";
  for (HeldTransport::Sent& s : transport.sent) {
    if (s.done != nullptr && &s != &transport.sent[1]) s.done(gone);
  }
}

// A worker joining a running run refuses pushes while it asks where the group is, then keeps
// the messages of the rounds after the state it takes. A round's push that waited for earlier
// ones to the joiner still reaches it, in order, once one ended: dropped, it was lost to the
// joiner, whose θ then missed that update (a split). Only the newest few wait, and none past its
// deadline.
TEST(Lane, AJoinersPushesPastTwoUnderWayWaitAndGoInOrder) {
  PeerHealth h(2);
  h.Joining(1);
  h.Returning(1);  // it asked where the group is
  Lane lane = LaneOf(2);
  HeldTransport transport;
  const absl::Time t0 = absl::Now() + absl::Hours(1);
  const auto deadline = [&](size_t i) { return transport.sent[i].deadline - t0; };
  for (int64_t step = 1; step < 5; ++step) PushRound(lane, step, {1}, t0, h, transport);
  ASSERT_EQ(transport.sent.size(), 2u) << "two in flight";
  transport.sent[0].done(absl::UnavailableError("worker 1 is rejoining the run"));
  PushRound(lane, 5, {1}, t0, h, transport);
  ASSERT_EQ(transport.sent.size(), 3u);
  EXPECT_EQ(deadline(2), absl::Seconds(13)) << "round 3's, the oldest held";
  transport.sent[1].done(SitsOutError(1, 2));
  // Its peers wait for it from round 6: every held round goes, the oldest first.
  h.MarkUp(1);
  PushRound(lane, 6, {1}, t0, h, transport);
  ASSERT_EQ(transport.sent.size(), 6u);
  EXPECT_EQ(deadline(3), absl::Seconds(14));
  EXPECT_EQ(deadline(4), absl::Seconds(15));
  EXPECT_EQ(deadline(5), absl::Seconds(16));

  // Down again: more than kMaxHeld rounds behind two under way keep the newest, and one whose
  // deadline passed meanwhile is not sent.
  uint64_t sent_to = 0;
  std::vector<int> mixed, dropped;
  h.Judge(0, 6, {1}, {{1, absl::DeadlineExceededError("slow")}}, {}, &sent_to, &mixed, &dropped);
  ASSERT_FALSE(h.up(1));
  const absl::Time past = absl::Now() - absl::Hours(1);
  for (int64_t step = 7; step < 11; ++step) PushRound(lane, step, {1}, t0, h, transport);
  PushRound(lane, 11, {1}, past, h, transport);
  PushRound(lane, 12, {1}, past, h, transport);
  ASSERT_EQ(transport.sent.size(), 6u) << "rounds 5 and 6 are still under way";
  transport.sent[4].done(absl::OkStatus());
  transport.sent[5].done(absl::OkStatus());
  PushRound(lane, 13, {1}, t0, h, transport);
  ASSERT_EQ(transport.sent.size(), 8u);
  EXPECT_EQ(deadline(6), absl::Seconds(19)) << "rounds 7 and 8 were dropped";
  EXPECT_EQ(deadline(7), absl::Seconds(20));
  transport.sent[6].done(absl::OkStatus());
  transport.sent[7].done(absl::OkStatus());
  PushRound(lane, 14, {1}, t0, h, transport);
  ASSERT_EQ(transport.sent.size(), 10u);
  EXPECT_EQ(deadline(8), absl::Seconds(23)) << "11 and 12 ran out";
  EXPECT_EQ(deadline(9), absl::Seconds(24));
}

}  // namespace
}  // namespace tern
