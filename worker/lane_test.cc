#include "worker/lane.h"

#include <map>
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

}  // namespace
}  // namespace tern
