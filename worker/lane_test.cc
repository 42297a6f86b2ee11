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

// A neighbour that is down gets one push at a time, with the round's deadline; one rejoining
// (heard from before, listening again) gets its pushes with the longer deadline and up to two in
// flight: it mixes those rounds later, from its inbox, while its state comes over the same link.
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
  Lane lane;
  lane.inbox = std::make_shared<GossipInbox>(32, 1);
  lane.last_push.resize(3);
  lane.push_before.resize(3);
  HeldTransport transport;
  auto chunks = std::make_shared<const std::vector<v1::BundleChunk>>();
  const absl::Time t0 = absl::Now();
  for (int64_t step = 2; step < 5; ++step) {
    InFlight r;
    r.step = step;
    r.nbrs = {1, 2};
    r.deadline = t0 + absl::Seconds(step);
    r.lasting_deadline = r.deadline + absl::Seconds(10);
    lane.Push(r, chunks, h, &transport);
  }
  // Worker 1: round 2's push only (a probe). Worker 2: rounds 2 and 3, not 4 while both run.
  ASSERT_EQ(transport.sent.size(), 3u);
  EXPECT_EQ(transport.sent[0].to, 1);
  EXPECT_EQ(transport.sent[0].deadline, t0 + absl::Seconds(2));
  EXPECT_EQ(transport.sent[1].to, 2);
  EXPECT_EQ(transport.sent[1].reach, PeerTransport::Reach::kWaitForReady);
  EXPECT_EQ(transport.sent[1].deadline, t0 + absl::Seconds(12));
  EXPECT_EQ(transport.sent[2].to, 2);
  EXPECT_EQ(transport.sent[2].deadline, t0 + absl::Seconds(13));
  // Round 2's push to worker 2 ends: round 5's goes.
  transport.sent[1].done(absl::OkStatus());
  InFlight r;
  r.step = 5;
  r.nbrs = {1, 2};
  r.deadline = t0 + absl::Seconds(5);
  r.lasting_deadline = r.deadline + absl::Seconds(10);
  lane.Push(r, chunks, h, &transport);
  ASSERT_EQ(transport.sent.size(), 4u);
  EXPECT_EQ(transport.sent[3].to, 2);
  for (HeldTransport::Sent& s : transport.sent) {
    if (s.done != nullptr && &s != &transport.sent[1]) s.done(gone);
  }
}

}  // namespace
}  // namespace tern
