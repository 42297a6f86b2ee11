// An edge aggregator (server/edge.h through the Aggregator): its rounds open only for a parent
// task, what it owes the parent is the change they made, weighted by the examples behind it,
// and a restart resumes the task with every update it had acknowledged.
#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/aggregator.h"
#include "server/aggregator_fixture.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::tern::testing::ValueOrFailure;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;
using testing_fixture::AggregatorTest;
const absl::Time kEdgeT0 = testing_fixture::kT0;
using testing_fixture::TempPath;

const std::vector<float> kParentModel = {0, 1, 0, 1, 0, 1, 0, 1, 0};

class EdgeTest : public AggregatorTest {
 protected:
  EdgeTest() { options_.edge_rounds = 1; }

  // Client c's update: c + 1 everywhere, with weight 10 (c + 1).
  void PushAll(Aggregator& a, int64_t round, const std::vector<uint32_t>& clients,
               absl::Time now = kEdgeT0) {
    for (uint32_t c : clients) {
      ASSERT_EQ(ValueOrFailure(a.Fetch(c, now)).task.kind(), v1::Task::TRAIN);
      EXPECT_EQ(
          ValueOrFailure(Push(a, c, round, 10.0 * (c + 1), std::vector<float>(9, c + 1.0f), now))
              .verdict(),
          v1::UpdateReply::ACCEPTED);
    }
  }
};

TEST_F(EdgeTest, RoundsOpenOnlyForAParentTaskAndTheEdgeOwesTheChangeTheyMade) {
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  // A model and three clients, but no parent task: no round.
  EXPECT_FALSE(a->Status(kEdgeT0).round_open());
  EXPECT_FALSE(a->Edge(false).active);
  EXPECT_EQ(ValueOrFailure(a->Fetch(0, kEdgeT0)).task.kind(), v1::Task::WAIT);

  ASSERT_THAT(a->Rebase(7, 4, 20, kParentModel), IsOk());
  ASSERT_THAT(a->Tick(kEdgeT0), IsOk());
  EXPECT_TRUE(a->Status(kEdgeT0).round_open());
  // The clients train from the parent's model.
  EXPECT_THAT(ModelOf(*a), Pointwise(FloatNear(0), kParentModel));
  EXPECT_EQ(ValueOrFailure(a->Fetch(1, kEdgeT0)).task.total_rounds(), 20u);
  EXPECT_FALSE(a->Edge(true).ready);
  PushAll(*a, 1, {0, 1, 2});
  ASSERT_THAT(a->Tick(kEdgeT0 + absl::Seconds(2)), IsOk());

  const Aggregator::EdgeProgress p = a->Edge(true);
  ASSERT_TRUE(p.ready);
  EXPECT_EQ(p.parent_round, 7);
  EXPECT_EQ(p.parent_client, 4);
  EXPECT_DOUBLE_EQ(p.weight, 60);
  // (10 * 1 + 20 * 2 + 30 * 3) / 60
  EXPECT_THAT(p.update, Pointwise(FloatNear(1e-5), std::vector<float>(9, 140.0f / 60)));
  // The task's one round is done: no other opens until the next task.
  ASSERT_THAT(a->Tick(kEdgeT0 + absl::Seconds(3)), IsOk());
  EXPECT_FALSE(a->Status(kEdgeT0).round_open());

  const std::vector<float> next(9, 2.0f);
  ASSERT_THAT(a->Rebase(8, 4, 20, next), IsOk());
  EXPECT_FALSE(a->Edge(true).ready);
  ASSERT_THAT(a->Tick(kEdgeT0 + absl::Seconds(3)), IsOk());
  EXPECT_TRUE(a->Status(kEdgeT0).round_open());
  EXPECT_EQ(ValueOrFailure(a->Fetch(0, kEdgeT0 + absl::Seconds(3))).task.round(), 2u);
  EXPECT_THAT(ModelOf(*a), Pointwise(FloatNear(0), next));
}

TEST_F(EdgeTest, ARestartedEdgeResumesItsTaskWithEveryUpdateItAcknowledged) {
  options_.checkpoint_path = TempPath("edge.ckpt");
  uint32_t crc = 0;
  {
    auto a = Start(3);
    ASSERT_NE(a, nullptr);
    ASSERT_THAT(a->Rebase(7, 4, 20, kParentModel), IsOk());
    ASSERT_THAT(a->Tick(kEdgeT0), IsOk());
    PushAll(*a, 1, {0, 2});
    crc = a->Edge(false).base_crc;
  }  // killed: what is on disk is what a SIGKILL leaves (each update logged before its reply)
  auto b = Aggregator::Create(options_, &registries_, kEdgeT0 + absl::Seconds(1));
  ASSERT_THAT(b, IsOk());
  const Aggregator::EdgeProgress p = (*b)->Edge(false);
  ASSERT_TRUE(p.active);
  EXPECT_EQ(p.parent_round, 7);
  EXPECT_EQ(p.parent_client, 4);  // taken back at the parent
  EXPECT_EQ(p.base_crc, crc);
  EXPECT_EQ((*b)->Status(kEdgeT0).updates_accepted(), 2u);
  EXPECT_EQ((*b)->Status(kEdgeT0).total_rounds(), 20u);  // the parent's, not the edge's flag
  PushAll(**b, 1, {1}, kEdgeT0 + absl::Seconds(1));
  ASSERT_THAT((*b)->Tick(kEdgeT0 + absl::Seconds(3)), IsOk());
  const Aggregator::EdgeProgress done = (*b)->Edge(true);
  ASSERT_TRUE(done.ready);
  EXPECT_DOUBLE_EQ(done.weight, 60);
  EXPECT_THAT(done.update, Pointwise(FloatNear(1e-5), std::vector<float>(9, 140.0f / 60)));
}

TEST_F(EdgeTest, ATaskWhoseRoundGotNoUpdateRunsAnotherRound) {
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  ASSERT_THAT(a->Rebase(7, 4, 20, kParentModel), IsOk());
  ASSERT_THAT(a->Tick(kEdgeT0), IsOk());
  // Past the deadline with no reply: the round closes empty, and the parent is owed more.
  ASSERT_THAT(a->Tick(kEdgeT0 + absl::Seconds(11)), IsOk());
  EXPECT_GE(a->Status(kEdgeT0).round(), 1u);
  EXPECT_FALSE(a->Edge(true).ready);
  ASSERT_THAT(a->Tick(kEdgeT0 + absl::Seconds(11)), IsOk());
  ASSERT_TRUE(a->Status(kEdgeT0).round_open());
  const int64_t round = static_cast<int64_t>(a->Status(kEdgeT0).round()) + 1;
  PushAll(*a, round, {1}, kEdgeT0 + absl::Seconds(11));
  ASSERT_THAT(a->Tick(kEdgeT0 + absl::Seconds(22)), IsOk());
  const Aggregator::EdgeProgress p = a->Edge(true);
  ASSERT_TRUE(p.ready);
  EXPECT_DOUBLE_EQ(p.weight, 20);
  EXPECT_THAT(p.update, Pointwise(FloatNear(1e-5), std::vector<float>(9, 2.0f)));
}

TEST_F(EdgeTest, ANewTaskClosesARoundOfTheOldOneUnusedAndCountsItsUpdatesDropped) {
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  ASSERT_THAT(a->Rebase(7, 4, 20, kParentModel), IsOk());
  ASSERT_THAT(a->Tick(kEdgeT0), IsOk());
  PushAll(*a, 1, {0});
  // The parent moved on (this edge restarted too late for round 7, say).
  const std::vector<float> next(9, 3.0f);
  ASSERT_THAT(a->Rebase(8, 4, 20, next), IsOk());
  EXPECT_EQ(a->Status(kEdgeT0).updates_dropped(), 1u);
  EXPECT_EQ(a->Status(kEdgeT0).round(), 1u);
  EXPECT_FALSE(a->Status(kEdgeT0).round_open());
  ASSERT_THAT(a->Tick(kEdgeT0), IsOk());
  PushAll(*a, 2, {0, 1, 2});
  ASSERT_THAT(a->Tick(kEdgeT0 + absl::Seconds(2)), IsOk());
  const Aggregator::EdgeProgress p = a->Edge(true);
  ASSERT_TRUE(p.ready);
  EXPECT_EQ(p.parent_round, 8);
  EXPECT_DOUBLE_EQ(p.weight, 60);  // the dropped update is not in it
}

TEST_F(EdgeTest, AParentModelOfAnotherSizeOrNotFiniteIsRefused) {
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  EXPECT_THAT(a->Rebase(7, 4, 20, std::vector<float>(8, 0.0f)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("8 parameters")));
  std::vector<float> nan = kParentModel;
  nan[3] = std::nanf("");
  EXPECT_THAT(a->Rebase(7, 4, 20, nan), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(a->Edge(false).active);
  ASSERT_THAT(a->Tick(kEdgeT0), IsOk());
  EXPECT_FALSE(a->Status(kEdgeT0).round_open());
}

// The parent's --lr_schedule reaches the edge's clients: they train at the parent task's rate,
// also after the edge restarts mid-task; without one (0), at the edge's own.
TEST_F(EdgeTest, TheClientsTrainAtTheParentTasksRateAlsoAfterARestart) {
  options_.checkpoint_path = TempPath("edge-lr.ckpt");
  {
    auto a = Start(3);
    ASSERT_NE(a, nullptr);
    EXPECT_THAT(a->Rebase(7, 4, 20, kParentModel, -1.0f),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rate")));
    EXPECT_FALSE(a->Edge(false).active);  // refused before anything changed
    ASSERT_THAT(a->Rebase(7, 4, 20, kParentModel, 0.025f), IsOk());
    ASSERT_THAT(a->Tick(kEdgeT0), IsOk());
    EXPECT_EQ(ValueOrFailure(a->Fetch(0, kEdgeT0)).task.local().lr(), 0.025f);
    PushAll(*a, 1, {0});
  }  // killed
  auto b = Aggregator::Create(options_, &registries_, kEdgeT0 + absl::Seconds(1));
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(ValueOrFailure((*b)->Fetch(1, kEdgeT0 + absl::Seconds(1))).task.local().lr(), 0.025f);
  PushAll(**b, 1, {1, 2}, kEdgeT0 + absl::Seconds(1));
  ASSERT_THAT((*b)->Tick(kEdgeT0 + absl::Seconds(3)), IsOk());
  EXPECT_FLOAT_EQ((*b)->Status(kEdgeT0).lr(), 0.025f);
  ASSERT_TRUE((*b)->Edge(true).ready);
  ASSERT_THAT((*b)->Rebase(8, 4, 20, kParentModel), IsOk());
  ASSERT_THAT((*b)->Tick(kEdgeT0 + absl::Seconds(4)), IsOk());
  EXPECT_EQ(ValueOrFailure((*b)->Fetch(0, kEdgeT0 + absl::Seconds(4))).task.local().lr(), 0.1f);
}

TEST_F(EdgeTest, AnEdgeRunsSynchronousRoundsAndSendsItsClientsTheModel) {
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.mode = "fedbuff"; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("federated or local-sgd")));
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.downstream = "delta"; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--downstream=model")));
  const ServerRegistries r = NewBuiltinServerRegistries();
  AggregatorOptions o = options_;
  o.edge_rounds = 0;
  auto plain = Aggregator::Create(o, &r, kEdgeT0);
  ASSERT_THAT(plain, IsOk());
  EXPECT_THAT((*plain)->Rebase(1, 0, 1, kParentModel),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not an edge")));
}

}  // namespace
}  // namespace tern
