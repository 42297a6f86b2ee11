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

}  // namespace
}  // namespace tern
