// The engine's small rooms, each alone: its counters, its kept snapshots, SwarmSGD's mailbox and
// the round graph.
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine_counters.h"
#include "worker/round_graph.h"
#include "worker/snapshot_store.h"
#include "worker/swarm_mailbox.h"

namespace tern {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

TEST(EngineCounters, AStepsDeltaHoldsWhatItAddedSinceThePreviousStepOnly) {
  EngineCounters c(3);
  c.CountReceived(1, 100, 120);
  v1::WorkerStats first = c.EndStep(/*communicated=*/true, 2.5f, 0.5, 0.1);
  EXPECT_EQ(first.worker_id(), 3u);
  EXPECT_EQ(first.steps(), 1u);
  EXPECT_EQ(first.rounds(), 1u);
  EXPECT_EQ(first.wire_bytes_received(), 120u);
  c.CountReceived(2, 10, 15);
  v1::WorkerStats second = c.EndStep(/*communicated=*/false, 1.0f, 0.25, -1);  // I/O < 0: none
  EXPECT_EQ(second.steps(), 1u);
  EXPECT_EQ(second.rounds(), 0u);
  EXPECT_EQ(second.wire_bytes_received(), 15u);
  EXPECT_DOUBLE_EQ(second.compute_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(second.trainer_io_seconds(), 0);
  EXPECT_GE(second.step_seconds(), 0);
  const v1::WorkerStats total = c.Stats();
  EXPECT_EQ(total.steps(), 2u);
  EXPECT_DOUBLE_EQ(total.loss_sum(), 3.5);
  EXPECT_EQ(c.PeerStats().at(1).wire_bytes_received, 120u);
  EXPECT_EQ(c.PeerStats().at(2).messages_received, 1u);
}

TEST(EngineCounters, ARoundCountsItsBytesOncePerNeighbourThatTookThemAndTheRefusalsByCode) {
  EngineCounters c(0);
  InFlight r;
  r.payload = 10;
  r.wire = 12;
  r.dense = 40;
  RoundReport report;
  report.results = {{1, absl::OkStatus()}, {2, absl::DeadlineExceededError("late")}};
  report.sent_to = 1;
  report.dropped = {2};
  c.CountRound(r, report, {1, 2});
  c.CountRefused(absl::InvalidArgumentError("bad"));
  c.CountRefused(absl::InvalidArgumentError("worse"));
  const v1::WorkerStats s = c.Stats();
  EXPECT_EQ(s.wire_bytes_sent(), 12u);
  EXPECT_EQ(s.dense_bytes_sent(), 40u);
  EXPECT_EQ(s.neighbours_dropped(), 1u);
  EXPECT_EQ(s.messages_refused(), 2u);
  EXPECT_EQ(c.PeerStats().count(2), 0u);
  EXPECT_EQ(c.PeerStats().at(1).messages_sent, 1u);
  EXPECT_EQ(c.PeersUp(), std::make_pair(1, 2));
  EXPECT_THAT(c.RefusalsByReason(), ElementsAre(Pair("INVALID_ARGUMENT", 2u)));
}

TEST(SnapshotStore, KeepsTheNewestAndEvictsTheOldestFirst) {
  SnapshotStore store(2);
  const std::vector<float> a = {1, 2}, b = {3, 4}, c = {5, 6};
  store.Keep(0, a);
  store.Keep(10, b);
  store.Keep(20, c);
  EXPECT_THAT(store.Steps(), ElementsAre(10, 20));
  EXPECT_FALSE(store.Get(0).has_value());
  ASSERT_TRUE(store.Get(20).has_value());
  EXPECT_EQ(*store.Get(20), c);
}

TEST(SnapshotStore, AFullStoreReusesTheEvictedBufferAndHoldsOnlyTheNewValues) {
  SnapshotStore store(2);
  store.Keep(0, std::vector<float>{1, 2, 3});
  store.Keep(1, std::vector<float>{4, 5});  // another size: a buffer of its own
  store.Keep(2, std::vector<float>{6, 7, 8});
  store.Keep(3, 3, [](absl::Span<float> out) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = 10.0f + static_cast<float>(i);
  });
  EXPECT_THAT(store.Steps(), ElementsAre(2, 3));
  EXPECT_THAT(*store.Get(2), ElementsAre(6, 7, 8));
  EXPECT_THAT(*store.Get(3), ElementsAre(10, 11, 12));
  SnapshotStore reserved(2);
  reserved.Reserve(3, 5);  // two at most
  reserved.Reserve(2, 1);  // another size: the first reservation's go
  reserved.Keep(0, std::vector<float>{1, 2});
  reserved.Keep(1, std::vector<float>{3, 4, 5});
  EXPECT_THAT(*reserved.Get(0), ElementsAre(1, 2));
  EXPECT_THAT(*reserved.Get(1), ElementsAre(3, 4, 5));
  SnapshotStore none(0);
  none.Keep(0, std::vector<float>{1});
  EXPECT_TRUE(none.Steps().empty());
}

TEST(SnapshotStore, AStepKeptAgainReplacesItsValuesAndEvictsNothing) {
  SnapshotStore store(2);
  store.Keep(1, std::vector<float>{1, 2});
  store.Keep(2, std::vector<float>{3, 4});
  store.Keep(2, std::vector<float>{5, 6});  // full, but step 2 is already kept
  EXPECT_THAT(store.Steps(), ElementsAre(1, 2));
  EXPECT_THAT(*store.Get(1), ElementsAre(1, 2));
  EXPECT_THAT(*store.Get(2), ElementsAre(5, 6));
}

TEST(SwarmMailbox, AnswersWithOurModelHoldsABoundedQueueAndRefusesOnceClosed) {
  SwarmMailbox box(2);
  EXPECT_TRUE(
      absl::IsUnavailable(box.Exchange({1, GossipMessage{}}).status()));  // nothing published
  auto ours = std::make_shared<const v1::TensorBundle>();
  box.Publish(ours);
  ASSERT_TRUE(box.Exchange({1, GossipMessage{}}).ok());
  absl::StatusOr<std::shared_ptr<const v1::TensorBundle>> reply =
      box.Exchange({2, GossipMessage{}});
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->get(), ours.get());
  EXPECT_TRUE(absl::IsResourceExhausted(box.Exchange({3, GossipMessage{}}).status()));
  std::vector<std::pair<int, GossipMessage>> taken = box.Take();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].first, 1);
  EXPECT_EQ(taken[1].first, 2);
  EXPECT_TRUE(box.Take().empty());
  box.Close();
  EXPECT_TRUE(absl::IsUnavailable(box.Exchange({1, GossipMessage{}}).status()));
}

TEST(RoundGraph, GivesThisWorkersNeighboursAndARowThatSumsToOne) {
  std::unique_ptr<TopologyRegistry> topologies = NewBuiltinTopologyRegistry();
  for (const char* name : {"ring", "exponential"}) {
    absl::StatusOr<std::unique_ptr<Topology>> t = topologies->Create(name);
    ASSERT_TRUE(t.ok()) << t.status();
    RoundGraph graph(*std::move(t), WeightRule::kAuto, /*worker_id=*/2, /*num_workers=*/8);
    for (int64_t round : {0, 1, 2, 1}) {
      absl::StatusOr<RoundGraph::Round> r = graph.At(round);
      ASSERT_TRUE(r.ok()) << r.status();
      Graph g = *graph.topology()->GraphFor(8, round);
      EXPECT_EQ(r->neighbours, g.neighbours[2]) << name << " round " << round;
      double sum = r->row.self;
      for (const auto& [j, w] : r->row.neighbours) sum += w;
      EXPECT_NEAR(sum, 1.0, 1e-12) << name << " round " << round;
      EXPECT_EQ(r->row.neighbours.size(), r->neighbours.size());
    }
  }
}

}  // namespace
}  // namespace tern
