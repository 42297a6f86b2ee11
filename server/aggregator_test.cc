#include "server/aggregator.h"

#include <stdlib.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/chunking.h"
#include "common/crc32.h"
#include "common/record_log.h"
#include "core/federated/protocol.h"
#include "core/model/adam.h"
#include "core/model/bundle.h"
#include "core/model/lr_schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/wire.h"
#include "server/aggregator_fixture.h"
#include "server/state_store.h"
#include "server/update_log.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::tern::testing::ValueOrFailure;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing_fixture::AggregatorTest;
using testing_fixture::kT0;
using testing_fixture::kX0;
using testing_fixture::Layout;
using testing_fixture::ReadAll;
using testing_fixture::TempPath;

TEST_F(AggregatorTest, FedAvgRoundAppliesTheSampleWeightedMeanOfTheUpdates) {
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  for (uint32_t c = 0; c < 3; ++c) {
    auto f = a->Fetch(c, kT0);
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ(f->task.kind(), v1::Task::TRAIN);
    EXPECT_EQ(f->task.round(), 1u);
    ASSERT_NE(f->chunks, nullptr);
  }
  std::vector<float> d0(9, 1.0f), d1(9, 2.0f), d2(9, -3.0f);
  EXPECT_EQ(ValueOrFailure(Push(*a, 0, 1, 1, d0)).verdict(), v1::UpdateReply::ACCEPTED);
  EXPECT_EQ(ValueOrFailure(Push(*a, 1, 1, 2, d1)).verdict(), v1::UpdateReply::ACCEPTED);
  ASSERT_THAT(a->Tick(kT0 + absl::Seconds(5)), IsOk());  // 2 of 3: not yet
  EXPECT_EQ(a->Status(kT0).round(), 0u);
  EXPECT_EQ(ValueOrFailure(Push(*a, 2, 1, 3, d2)).verdict(), v1::UpdateReply::ACCEPTED);
  ASSERT_THAT(a->Tick(kT0 + absl::Seconds(5)), IsOk());  // all replied: closes at once
  const v1::ServerStatus st = a->Status(kT0);
  EXPECT_EQ(st.round(), 1u);
  EXPECT_EQ(st.updates_accepted(), 3u);
  EXPECT_EQ(st.last_round_updates(), 3u);
  const float mean = (1 * 1.0f + 2 * 2.0f + 3 * -3.0f) / 6;  // -4/6
  std::vector<float> want = kX0;
  for (float& v : want) v += mean;
  const std::vector<float> got = ModelOf(*a);
  for (size_t i = 0; i < 9; ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  // Round 2 opened with 3 clients; the model of round 1 stays available.
  EXPECT_EQ(ValueOrFailure(a->Fetch(0, kT0)).task.round(), 2u);
  EXPECT_THAT(a->Model(1), IsOk());
}

TEST_F(AggregatorTest, RefusedUpdatesAreNamedAndOnlyWhatTheyHoldSpendsTheSendersTurn) {
  options_.policy.clients_per_round = 2;
  options_.policy.min_replies = 2;
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  const std::vector<int> sampled = [&] {
    std::vector<int> s;
    for (uint32_t c = 0; c < 3; ++c) {
      if (ValueOrFailure(a->Fetch(c, kT0)).task.kind() == v1::Task::TRAIN)
        s.push_back(static_cast<int>(c));
    }
    return s;
  }();
  ASSERT_EQ(sampled.size(), 2u);
  const uint32_t in = static_cast<uint32_t>(sampled[0]), in2 = static_cast<uint32_t>(sampled[1]);
  const uint32_t out = 3 - in - in2;
  const std::vector<float> d(9, 1.0f);
  EXPECT_THAT(Push(*a, in, 2, 1, d), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(Push(*a, out, 1, 1, d), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(Push(*a, 7, 1, 1, d), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Push(*a, in, 1, 0, d), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::UpdateInfo info;
  info.set_client_id(in);
  info.set_round(1);
  info.set_weight(1);
  v1::TensorBundle bad = Update(d, 1);
  bad.set_run_id("other");
  EXPECT_THAT(a->Push(info, bad, 0, kT0), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = Update(d, 2);  // the bundle and the header disagree
  EXPECT_THAT(a->Push(info, bad, 0, kT0), StatusIs(absl::StatusCode::kInvalidArgument));
  // What an update holds: refused, and the sender's turn in the round is spent.
  EXPECT_THAT(Push(*a, in2, 1, 1, std::vector<float>(9, NAN)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NaN")));
  info.set_client_id(in2);
  bad = Update(d, 1);
  bad.mutable_tensors(0)->mutable_tensor()->mutable_payload()->resize(5);  // truncated
  EXPECT_THAT(a->Push(info, bad, 0, kT0), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = Update(d, 1);
  bad.mutable_tensors()->RemoveLast();  // a tensor missing
  EXPECT_THAT(a->Push(info, bad, 0, kT0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(a->Status(kT0).updates_refused(), 9u);
  // The header's refusals took no reply slot: `in` still counts.
  EXPECT_THAT(Push(*a, in, 1, 1, d), IsOk());
  EXPECT_THAT(Push(*a, in, 1, 1, d), StatusIs(absl::StatusCode::kAlreadyExists));
  // in2 gets no second draw this round: no task, and its good update is refused too.
  EXPECT_EQ(ValueOrFailure(a->Fetch(in2, kT0)).task.kind(), v1::Task::WAIT);
  EXPECT_THAT(Push(*a, in2, 1, 1, std::vector<float>(9, 3.0f)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("spent")));
  // The round does not wait for it: it closes on in's update alone.
  ASSERT_THAT(a->Tick(kT0), IsOk());
  std::vector<float> want = kX0;
  for (float& v : want) v += 1.0f;
  EXPECT_THAT(ModelOf(*a), ElementsAreArray(want));
}

TEST_F(AggregatorTest, ARoundClosesAtItsDeadlineWithoutTheSilentClient) {
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  EXPECT_THAT(Push(*a, 0, 1, 1, std::vector<float>(9, 1.0f)), IsOk());
  EXPECT_THAT(Push(*a, 1, 1, 1, std::vector<float>(9, 3.0f)), IsOk());
  ASSERT_THAT(a->Tick(kT0 + absl::Seconds(9)), IsOk());
  EXPECT_EQ(a->Status(kT0).round(), 0u);
  ASSERT_THAT(a->Tick(kT0 + absl::Seconds(10)), IsOk());
  EXPECT_EQ(a->Status(kT0).round(), 1u);
  std::vector<float> want = kX0;
  for (float& v : want) v += 2.0f;
  EXPECT_THAT(ModelOf(*a), ElementsAreArray(want));
  // The late client's update for the closed round is dropped (no staleness weighting).
  EXPECT_EQ(ValueOrFailure(Push(*a, 2, 1, 1, std::vector<float>(9, 100.0f))).verdict(),
            v1::UpdateReply::DROPPED);
}

TEST_F(AggregatorTest, LateUpdatesAreStalenessWeightedIntoTheNextClose) {
  options_.policy.staleness_decay = 0.5;
  options_.policy.max_staleness = 2;
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  EXPECT_THAT(Push(*a, 0, 1, 1, std::vector<float>(9, 1.0f)), IsOk());
  ASSERT_THAT(a->Tick(kT0 + absl::Seconds(10)), IsOk());  // closes round 1 with one update
  // Round 2 is open (opened at +10 s); client 1's late update for round 1 gets weight 0.5.
  EXPECT_EQ(ValueOrFailure(Push(*a, 1, 1, 1, std::vector<float>(9, 4.0f))).verdict(),
            v1::UpdateReply::ACCEPTED_STALE);
  EXPECT_THAT(Push(*a, 0, 2, 1, std::vector<float>(9, 1.0f)), IsOk());
  ASSERT_THAT(a->Tick(kT0 + absl::Seconds(20)), IsOk());
  EXPECT_EQ(a->Status(kT0).round(), 2u);
  // Round 2's mean: (0.5 * 4 + 1 * 1) / 1.5 = 2; on top of round 1's +1.
  std::vector<float> want = kX0;
  for (float& v : want) v += 3.0f;
  const std::vector<float> got = ModelOf(*a);
  for (size_t i = 0; i < 9; ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
}

TEST_F(AggregatorTest, AClientIdBelongsToWhoJoinedAsItAlsoAfterARestart) {
  options_.checkpoint_path = TempPath("owners.ckpt");
  auto join = [](Aggregator& a, int64_t id, const std::string& who) {
    v1::JoinRequest j;
    j.set_run_id("r");
    j.set_client_id(id);
    absl::Status s;
    const v1::JoinReply r = a.Join(j, kT0, &s, who);
    return s.ok() ? absl::StatusOr<uint32_t>(r.client_id()) : absl::StatusOr<uint32_t>(s);
  };
  {
    auto a = Aggregator::Create(options_, &registries_, kT0);
    ASSERT_THAT(a, IsOk());
    EXPECT_EQ(ValueOrFailure(join(**a, -1, "alice")), 0u);
    EXPECT_EQ(ValueOrFailure(join(**a, -1, "bob")), 1u);
    EXPECT_THAT((*a)->CheckCaller(0, "alice"), IsOk());
    EXPECT_THAT((*a)->CheckCaller(0, "bob"), StatusIs(absl::StatusCode::kPermissionDenied));
    EXPECT_THAT((*a)->CheckCaller(7, "bob"), StatusIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(join(**a, 0, "bob").status(), StatusIs(absl::StatusCode::kPermissionDenied));
    auto b = FlatToBundle(layout_, x0_);
    ASSERT_THAT(b, IsOk());
    ASSERT_THAT((*a)->InitModel(0, *b), IsOk());  // writes the checkpoint
  }
  auto a = Aggregator::Create(options_, &registries_, kT0 + absl::Minutes(1));
  ASSERT_THAT(a, IsOk());
  EXPECT_THAT((*a)->CheckCaller(1, "alice"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(join(**a, 1, "alice").status(), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(ValueOrFailure(join(**a, 1, "bob")), 1u) << "its owner takes it back";
}

TEST_F(AggregatorTest, ARestartedServerResumesTheOpenRoundWithItsAcceptedUpdates) {
  for (const std::string rule : {"fedavg", "median"}) {
    SCOPED_TRACE(rule);
    options_.rule = rule;
    options_.checkpoint_path = TempPath("server.ckpt");
    {
      auto a = Start(3);
      ASSERT_NE(a, nullptr);
      EXPECT_THAT(Push(*a, 0, 1, 1, std::vector<float>(9, 1.0f)), IsOk());
      EXPECT_THAT(Push(*a, 1, 1, 1, std::vector<float>(9, 2.0f)), IsOk());
    }  // killed: only the checkpoint file survives
    auto b = Aggregator::Create(options_, &registries_, kT0 + absl::Minutes(1));
    ASSERT_THAT(b, IsOk());
    const v1::ServerStatus st = (*b)->Status(kT0 + absl::Minutes(1));
    EXPECT_EQ(st.restarts(), 1u);
    EXPECT_EQ(st.updates_accepted(), 2u);
    EXPECT_TRUE(st.round_open());
    // The round is still 1, client 0 already replied, client 2 is still expected.
    EXPECT_THAT(Push(**b, 0, 1, 1, std::vector<float>(9, 1.0f), kT0 + absl::Minutes(1)),
                StatusIs(absl::StatusCode::kAlreadyExists));
    EXPECT_EQ(ValueOrFailure((*b)->Fetch(2, kT0 + absl::Minutes(1))).task.kind(), v1::Task::TRAIN);
    EXPECT_THAT(Push(**b, 2, 1, 1, std::vector<float>(9, 6.0f), kT0 + absl::Minutes(1)), IsOk());
    ASSERT_THAT((*b)->Tick(kT0 + absl::Minutes(1)), IsOk());
    EXPECT_EQ((*b)->Status(kT0).round(), 1u);
    // fedavg: (1 + 2 + 6) / 3 = 3; median of {1, 2, 6} = 2.
    std::vector<float> want = kX0;
    for (float& v : want) v += rule == "fedavg" ? 3.0f : 2.0f;
    const std::vector<float> got = ModelOf(**b);
    for (size_t i = 0; i < 9; ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  }
}

// Federated evaluation: the round's task asks for it, each client's report rides on its update,
// and the close keeps the examples-weighted mean; reports accepted before a restart count.
TEST_F(AggregatorTest, FederatedEvaluationIsTheExamplesWeightedMeanOfTheReportsAlsoAfterARestart) {
  options_.eval_every = 2;
  options_.checkpoint_path = TempPath("eval.ckpt");
  auto push = [&](Aggregator& a, uint32_t client, int64_t round, double examples, double loss,
                  double accuracy, absl::Time now) {
    v1::UpdateInfo info;
    info.set_client_id(client);
    info.set_round(static_cast<uint64_t>(round));
    info.set_weight(1);
    info.mutable_eval()->set_examples(examples);
    info.mutable_eval()->set_loss(loss);
    info.mutable_eval()->set_accuracy(accuracy);
    return a.Push(info, Update(std::vector<float>(9, 0.0f), round), 100, now);
  };
  {
    auto a = Start(3);
    ASSERT_NE(a, nullptr);
    EXPECT_FALSE(ValueOrFailure(a->Fetch(0, kT0)).task.evaluate());  // round 1 of every 2
    for (uint32_t c = 0; c < 3; ++c)
      EXPECT_THAT(Push(*a, c, 1, 1, std::vector<float>(9, 0)), IsOk());
    ASSERT_THAT(a->Tick(kT0), IsOk());
    EXPECT_EQ(a->Status(kT0).eval_round(), 0u);                     // nothing evaluated yet
    EXPECT_TRUE(ValueOrFailure(a->Fetch(0, kT0)).task.evaluate());  // round 2
    // A report it cannot use is refused with the reason, and changes nothing.
    EXPECT_THAT(push(*a, 0, 2, 100, 1.0, 1.5, kT0),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("accuracy in [0, 1]")));
    EXPECT_THAT(push(*a, 0, 2, 100, 1.0, 0.5, kT0), IsOk());
    EXPECT_THAT(push(*a, 1, 2, 300, 2.0, 0.9, kT0), IsOk());
  }  // killed with two reports in
  auto b = Aggregator::Create(options_, &registries_, kT0 + absl::Minutes(1));
  ASSERT_THAT(b, IsOk());
  const absl::Time t1 = kT0 + absl::Minutes(1);
  EXPECT_THAT(Push(**b, 2, 2, 1, std::vector<float>(9, 0)), IsOk());  // no report: not counted
  ASSERT_THAT((*b)->Tick(t1), IsOk());
  const v1::ServerStatus st = (*b)->Status(t1);
  EXPECT_EQ(st.eval_round(), 2u);
  EXPECT_EQ(st.eval_clients(), 2u);
  EXPECT_DOUBLE_EQ(st.eval_examples(), 400);
  EXPECT_NEAR(st.eval_loss(), (100 * 1.0 + 300 * 2.0) / 400, 1e-12);
  EXPECT_NEAR(st.eval_accuracy(), (100 * 0.5 + 300 * 0.9) / 400, 1e-12);
}

TEST_F(AggregatorTest, AcceptedUpdatesAreAppendedToTheLogAndTheSnapshotWaitsForTheRound) {
  options_.checkpoint_path = TempPath("server.ckpt");
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  const std::string snapshot = ReadAll(options_.checkpoint_path);
  ASSERT_FALSE(snapshot.empty());
  EXPECT_THAT(Push(*a, 0, 1, 1, std::vector<float>(9, 1.0f)), IsOk());
  EXPECT_THAT(Push(*a, 1, 1, 1, std::vector<float>(9, 2.0f)), IsOk());
  // One record each, the snapshot untouched: no copy of every client and the model per update.
  EXPECT_EQ(ReadAll(options_.checkpoint_path), snapshot);
  internal::AggregatorCheckpoint ckpt =
      ValueOrFailure(StateStore::ParseSnapshot(snapshot, nullptr));
  auto logged = UpdateLog::Read(options_.checkpoint_path, ckpt.generation());
  ASSERT_THAT(logged, IsOk());
  ASSERT_EQ(logged->updates.size(), 2u);
  EXPECT_EQ(logged->updates[1].client(), 1u);
  EXPECT_EQ(logged->updates[1].round(), 1u);
  // The round's close takes a new snapshot and starts a fresh log.
  EXPECT_THAT(Push(*a, 2, 1, 1, std::vector<float>(9, 3.0f)), IsOk());
  ASSERT_THAT(a->Tick(kT0 + absl::Seconds(2)), IsOk());
  ckpt = ValueOrFailure(StateStore::ParseSnapshot(ReadAll(options_.checkpoint_path), nullptr));
  EXPECT_EQ(ckpt.round(), 1u);
  EXPECT_TRUE(ReadRecordLog(UpdateLog::PathFor(options_.checkpoint_path))->records.empty());
}

TEST_F(AggregatorTest, LogRecordsOfAnOlderSnapshotAreNotCountedTwice) {
  // The server died after writing a snapshot and before starting the fresh log: the log beside
  // it still holds the updates the snapshot already has.
  options_.checkpoint_path = TempPath("server.ckpt");
  const std::string log_path = UpdateLog::PathFor(options_.checkpoint_path);
  std::string old_log;
  {
    auto a = Start(3);
    ASSERT_NE(a, nullptr);
    EXPECT_THAT(Push(*a, 0, 1, 1, std::vector<float>(9, 1.0f)), IsOk());
    EXPECT_THAT(Push(*a, 1, 1, 1, std::vector<float>(9, 2.0f)), IsOk());
    old_log = ReadAll(log_path);
    EXPECT_THAT(Push(*a, 2, 1, 1, std::vector<float>(9, 6.0f)), IsOk());
    ASSERT_THAT(a->Tick(kT0 + absl::Seconds(2)), IsOk());  // round 1 closes: a new snapshot
  }
  std::ofstream(log_path, std::ios::trunc | std::ios::binary) << old_log;
  auto b = Aggregator::Create(options_, &registries_, kT0 + absl::Minutes(1));
  ASSERT_THAT(b, IsOk());
  const v1::ServerStatus st = (*b)->Status(kT0 + absl::Minutes(1));
  EXPECT_EQ(st.round(), 1u);
  EXPECT_EQ(st.updates_accepted(), 3u);
  std::vector<float> want = kX0;
  for (float& v : want) v += 3.0f;
  EXPECT_THAT(ModelOf(**b), ElementsAreArray(want));
}

TEST_F(AggregatorTest, ConcurrentPushesAreAllCountedAndTheMeanIsExact) {
  constexpr int kClients = 64;
  options_.policy.clients_per_round = kClients;
  options_.policy.min_replies = kClients;
  options_.checkpoint_path = TempPath("server.ckpt");
  auto a = Start(kClients);
  ASSERT_NE(a, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> accepted{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int c = t; c < kClients; c += 8) {
        auto r = Push(*a, static_cast<uint32_t>(c), 1, 1, std::vector<float>(9, float(c % 4)));
        if (r.ok() && r->verdict() == v1::UpdateReply::ACCEPTED) ++accepted;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(accepted.load(), kClients);
  ASSERT_THAT(a->Tick(kT0 + absl::Seconds(2)), IsOk());
  const v1::ServerStatus st = a->Status(kT0);
  EXPECT_EQ(st.round(), 1u);
  EXPECT_EQ(st.last_round_updates(), uint32_t{kClients});
  std::vector<float> want = kX0;
  for (float& v : want) v += 1.5f;  // the mean of 0, 1, 2, 3
  EXPECT_THAT(ModelOf(*a), ElementsAreArray(want));
}

TEST_F(AggregatorTest, ACorruptOrForeignCheckpointIsAnErrorNotAFreshStart) {
  options_.checkpoint_path = TempPath("server.ckpt");
  std::ofstream(options_.checkpoint_path) << "not a checkpoint \xff\xff\xff";
  EXPECT_THAT(Aggregator::Create(options_, &registries_, kT0),
              StatusIs(absl::StatusCode::kDataLoss));
  internal::AggregatorCheckpoint old_format;  // e.g. one written before the format changed
  old_format.set_run_id(options_.run_id);
  std::ofstream(options_.checkpoint_path, std::ios::trunc) << old_format.SerializeAsString();
  EXPECT_THAT(Aggregator::Create(options_, &registries_, kT0),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("format 0")));
  internal::AggregatorCheckpoint other;
  other.set_format(2);
  other.set_run_id("another-run");
  std::ofstream(options_.checkpoint_path, std::ios::trunc) << other.SerializeAsString();
  EXPECT_THAT(Aggregator::Create(options_, &registries_, kT0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another-run")));
}

TEST_F(AggregatorTest, LocalSgdSamplesEveryClientAndServerMomentumAccumulates) {
  options_.mode = "local-sgd";
  options_.server_momentum = 0.5;
  auto a = Start(4);
  ASSERT_NE(a, nullptr);
  for (int round = 1; round <= 2; ++round) {
    for (uint32_t c = 0; c < 4; ++c) {
      ASSERT_EQ(ValueOrFailure(a->Fetch(c, kT0)).task.kind(), v1::Task::TRAIN) << round;
      ASSERT_THAT(Push(*a, c, round, 1, std::vector<float>(9, 1.0f)), IsOk());
    }
    ASSERT_THAT(a->Tick(kT0), IsOk());
  }
  // m1 = 1, x += 1; m2 = 0.5 + 1, x += 1.5.
  std::vector<float> want = kX0;
  for (float& v : want) v += 2.5f;
  EXPECT_THAT(ModelOf(*a), ElementsAreArray(want));
}

TEST_F(AggregatorTest, DiLoCosNesterovOuterStepMovesTheModelAsTorchsSgdWould) {
  options_.mode = "local-sgd";
  options_.outer = "nesterov:lr=0.7,momentum=0.9";
  auto a = Start(2);
  ASSERT_NE(a, nullptr);
  for (int round = 1; round <= 2; ++round) {
    for (uint32_t c = 0; c < 2; ++c) {
      ASSERT_EQ(ValueOrFailure(a->Fetch(c, kT0)).task.kind(), v1::Task::TRAIN) << round;
      ASSERT_THAT(Push(*a, c, round, 1, std::vector<float>(9, 1.0f)), IsOk());
    }
    ASSERT_THAT(a->Tick(kT0), IsOk());
  }
  // m1 = 1, x += 0.7 (1 + 0.9); m2 = 1.9, x += 0.7 (1 + 0.9 * 1.9).
  const std::vector<float> x = ModelOf(*a);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_FLOAT_EQ(x[i], kX0[i] + 1.33f + 1.897f) << i;
}

TEST_F(AggregatorTest, TheOuterMomentumSurvivesARestart) {
  options_.mode = "local-sgd";
  options_.outer = "nesterov";
  options_.checkpoint_path = TempPath("ckpt");
  {
    auto a = Start(2);
    ASSERT_NE(a, nullptr);
    for (uint32_t c = 0; c < 2; ++c)
      ASSERT_THAT(Push(*a, c, 1, 1, std::vector<float>(9, 1.0f)), IsOk());
    ASSERT_THAT(a->Tick(kT0), IsOk());
  }
  auto b = ValueOrFailure(Aggregator::Create(options_, &registries_, kT0 + absl::Minutes(1)));
  ASSERT_THAT(b->Tick(kT0 + absl::Minutes(1)), IsOk());
  for (uint32_t c = 0; c < 2; ++c) {
    ASSERT_THAT(Push(*b, c, 2, 1, std::vector<float>(9, 1.0f), kT0 + absl::Minutes(1)), IsOk());
  }
  ASSERT_THAT(b->Tick(kT0 + absl::Minutes(1)), IsOk());
  EXPECT_FLOAT_EQ(ModelOf(*b)[0], kX0[0] + 1.33f + 1.897f) << "the momentum was lost";
}

TEST_F(AggregatorTest, SparseLoCoTellsClientsToDecayTheirErrorFeedback) {
  options_.mode = "local-sgd";
  options_.outer = "sparseloco:beta=0.9";
  options_.task.set_update_codec("topk:ratio=0.5");
  auto a = Start(2);
  ASSERT_NE(a, nullptr);
  const v1::Task task = ValueOrFailure(a->Fetch(0, kT0)).task;
  EXPECT_TRUE(task.error_feedback());
  EXPECT_FLOAT_EQ(task.residual_decay(), 0.9f);
  options_.task.set_memory("dgc");
  EXPECT_THAT(Aggregator::Create(options_, &registries_, kT0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--memory")));
}

TEST_F(AggregatorTest, AnOuterOptimizerIsRefusedWhereItCannotApply) {
  options_.mode = "local-sgd";
  options_.outer = "adam";
  EXPECT_THAT(Aggregator::Create(options_, &registries_, kT0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nesterov")));
  options_.outer = "nesterov";
  options_.server_momentum = 0.5;
  EXPECT_THAT(Aggregator::Create(options_, &registries_, kT0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--server_momentum")));
  options_.server_momentum = 0;
  options_.mode = "ps";
  options_.task.mutable_gradient()->set_batch(8);
  options_.task.mutable_gradient()->set_lr(0.1f);
  options_.task.mutable_gradient()->set_optimizer("sgd");
  EXPECT_THAT(Aggregator::Create(options_, &registries_, kT0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ps")));
}

TEST_F(AggregatorTest, TheRunEndsAfterItsRoundsAndClientsAreToldSo) {
  options_.total_rounds = 1;
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  for (uint32_t c = 0; c < 3; ++c) ASSERT_THAT(Push(*a, c, 1, 1, std::vector<float>(9, 0)), IsOk());
  ASSERT_THAT(a->Tick(kT0), IsOk());
  EXPECT_TRUE(a->done());
  EXPECT_EQ(ValueOrFailure(a->Fetch(1, kT0)).task.kind(), v1::Task::DONE);
}

TEST_F(AggregatorTest, ADownstreamCodecEncodesTheModelOncePerRound) {
  options_.downstream_codec = "fp16";
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  auto f0 = a->Fetch(0, kT0);
  ASSERT_THAT(f0, IsOk());
  auto f1 = a->Fetch(1, kT0);
  ASSERT_THAT(f1, IsOk());
  ASSERT_THAT(f0, IsOk());
  EXPECT_EQ(f0->chunks, f1->chunks);  // shared, not re-encoded
  const v1::ServerStatus st = a->Status(kT0);
  EXPECT_EQ(st.dense_bytes_down(), 2u * 9 * 4);
  EXPECT_EQ(st.payload_bytes_down(), 2u * 9 * 2);  // fp16 halves the model
}

TEST_F(AggregatorTest, DeltaDownstreamCatchesClientsUpBitExactlyWithFewerBytesThanTheModel) {
  // A model big enough that sparse updates are cheaper than it: w [40, 25], b [25].
  layout_ = {ParamTensor{"w", {40, 25}, 0, 1000}, ParamTensor{"b", {25}, 1000, 25}};
  x0_.resize(1025);
  for (size_t i = 0; i < x0_.size(); ++i) x0_[i] = std::sin(0.1f * static_cast<float>(i));
  options_.downstream = "delta";
  options_.downstream_codec = "stc:ratio=0.05";
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  const uint32_t crc0 = Crc32(x0_.data(), 4 * x0_.size());
  // Round 1: a client holding the initial model gets no model bytes at all.
  auto f = a->Fetch(0, kT0, 0, crc0);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->task.payload(), v1::Task::DELTAS);
  EXPECT_EQ(f->task.delta_from(), 0);
  EXPECT_EQ(f->task.model_crc32(), crc0);
  EXPECT_EQ(a->Status(kT0).payload_bytes_down(), 0u);
  std::vector<float> u(1025);
  for (size_t i = 0; i < u.size(); ++i) u[i] = std::cos(0.37f * static_cast<float>(i));
  for (int round = 1; round <= 2; ++round) {
    for (uint32_t c = 0; c < 3; ++c) ASSERT_THAT(Push(*a, c, round, 1, u), IsOk());
    ASSERT_THAT(a->Tick(kT0), IsOk());
  }
  ASSERT_EQ(a->Status(kT0).round(), 2u);
  // Round 3: a client still at round 0 catches up from the two kept updates, in order.
  f = a->Fetch(0, kT0, 0, crc0);
  ASSERT_THAT(f, IsOk());
  ASSERT_EQ(f->task.payload(), v1::Task::DELTAS);
  BundleAssembler assembler(1 << 20);
  for (const v1::BundleChunk& c : *f->chunks) ASSERT_THAT(assembler.Add(c), IsOk());
  auto b = assembler.Finish();
  ASSERT_THAT(b, IsOk());
  ASSERT_EQ(b->tensors_size(), 4);  // 2 rounds x 2 tensors
  EXPECT_EQ(b->tensors(0).name(), "1:w");
  EXPECT_EQ(b->tensors(3).name(), "2:b");
  std::vector<float> copy = x0_;
  for (const v1::NamedTensor& nt : b->tensors()) {
    const ParamTensor& p = nt.name().back() == 'w' ? layout_[0] : layout_[1];
    std::vector<float> v(p.numel);
    ASSERT_THAT(DecodeMessage(*codecs_, nt.tensor(), absl::MakeSpan(v)), IsOk());
    for (size_t i = 0; i < p.numel; ++i) copy[p.offset + i] += v[i];
  }
  EXPECT_EQ(Crc32(copy.data(), 4 * copy.size()), f->task.model_crc32());
  EXPECT_EQ(copy, ModelOf(*a));  // bit-identical
  EXPECT_LT(a->Status(kT0).payload_bytes_down(), 4u * 1025 / 4);
  // A client with no copy, or a wrong one, gets the exact model instead.
  EXPECT_EQ(ValueOrFailure(a->Fetch(1, kT0, -1, 0)).task.payload(), v1::Task::MODEL);
  EXPECT_EQ(ValueOrFailure(a->Fetch(2, kT0, 0, crc0 ^ 1)).task.payload(), v1::Task::MODEL);
  // Sparse steps, but with the residual fed back the model moves most of the way to x0 + 2u.
  const std::vector<float> x = ModelOf(*a);
  double err = 0, full = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += std::pow(x[i] - (x0_[i] + 2 * u[i]), 2);
    full += std::pow(2 * u[i], 2);
  }
  EXPECT_LT(err, full);
}

// BatchNorm's running statistics and the like: a client that compresses its update but sends a
// tensor exactly (tern.federated's exact_tensors) gets that tensor's change back exactly, with
// no server residual to overshoot it; a client that sends everything exactly marks nothing.
TEST_F(AggregatorTest, TensorsClientsSendExactlyBesideCompressedOnesGoDownstreamExactly) {
  layout_ = {ParamTensor{"w", {40, 25}, 0, 1000}, ParamTensor{"b", {25}, 1000, 25}};
  x0_.assign(1025, 0.5f);
  options_.downstream = "delta";
  options_.downstream_codec = "topk:ratio=0.05";
  options_.task.set_update_codec("topk:ratio=0.5");
  std::vector<float> u(1025);
  for (size_t i = 0; i < u.size(); ++i) u[i] = std::cos(0.37f * static_cast<float>(i));
  for (const bool mixed : {true, false}) {
    SCOPED_TRACE(mixed ? "w compressed, b exact" : "everything exact");
    auto a = Start(2);
    ASSERT_NE(a, nullptr);
    v1::TensorBundle update = Update(u, 1, mixed ? "topk:ratio=0.5" : "none");
    *update.mutable_tensors(1) = ValueOrFailure(FlatToBundle(layout_, u)).tensors(1);
    for (uint32_t c = 0; c < 2; ++c) {
      v1::UpdateInfo info;
      info.set_client_id(c);
      info.set_round(1);
      info.set_weight(1);
      info.set_loss(1.0f);
      ASSERT_THAT(a->Push(info, update, 100, kT0), IsOk());
    }
    ASSERT_THAT(a->Tick(kT0), IsOk());
    ASSERT_EQ(a->Status(kT0).round(), 1u);
    auto f = a->Fetch(0, kT0, 0, Crc32(x0_.data(), 4 * x0_.size()));
    ASSERT_THAT(f, IsOk());
    ASSERT_EQ(f->task.payload(), v1::Task::DELTAS);
    BundleAssembler assembler(1 << 20);
    for (const v1::BundleChunk& c : *f->chunks) ASSERT_THAT(assembler.Add(c), IsOk());
    const v1::TensorBundle deltas = ValueOrFailure(assembler.Finish());
    ASSERT_EQ(deltas.tensors_size(), 2);
    EXPECT_EQ(deltas.tensors(1).name(), "1:b");
    const std::vector<float> x = ModelOf(*a);
    if (mixed) {
      EXPECT_EQ(deltas.tensors(1).tensor().codec(), "none.v1");
      for (size_t i = 1000; i < 1025; ++i) EXPECT_EQ(x[i], 0.5f + u[i]) << i;
    } else {
      EXPECT_NE(deltas.tensors(1).tensor().codec(), "none.v1");
    }
    EXPECT_NE(deltas.tensors(0).tensor().codec(), "none.v1");
  }
}

TEST_F(AggregatorTest, OnebitAdamWarmsUpDenseThenSendsMomentaBothWaysAndCopiesStayBitExact) {
  layout_ = {ParamTensor{"w", {40, 25}, 0, 1000}, ParamTensor{"b", {25}, 1000, 25}};
  x0_.resize(1025);
  for (size_t i = 0; i < x0_.size(); ++i) x0_[i] = std::sin(0.1f * static_cast<float>(i));
  options_.mode = "ps";
  options_.total_rounds = 6;
  v1::GradientStep* step = options_.task.mutable_gradient();
  step->set_batch(8);
  step->set_optimizer("onebit-adam");
  step->set_warmup_rounds(2);
  step->set_lr(0.01f);
  step->set_beta1(0.9f);
  step->set_eps(1e-8f);
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  auto grad = [&](uint32_t c, int round) {
    std::vector<float> g(1025);
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::cos(0.37f * i + c + 0.5f * round);
    return g;
  };
  auto fetch_bundle = [&](const FetchResult& f) {
    BundleAssembler assembler(1 << 24);
    for (const v1::BundleChunk& c : *f.chunks) EXPECT_THAT(assembler.Add(c), IsOk());
    return ValueOrFailure(assembler.Finish());
  };
  // Warm-up: dense gradients up, the exact model down, no optimizer state.
  for (int round = 1; round <= 2; ++round) {
    auto f = a->Fetch(0, kT0);
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ(f->task.update_codec(), "none");
    EXPECT_FALSE(f->task.error_feedback());
    EXPECT_EQ(fetch_bundle(*f).tensors_size(), 2);
    for (uint32_t c = 0; c < 3; ++c) ASSERT_THAT(Push(*a, c, round, 1, grad(c, round)), IsOk());
    ASSERT_THAT(a->Tick(kT0), IsOk());
  }
  // Round 3: compressed. A client without the state gets the model with m, v and the ratios.
  auto f = a->Fetch(0, kT0, 2, 0, /*have_state=*/false);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->task.update_codec(), "sign");
  EXPECT_TRUE(f->task.error_feedback());
  ASSERT_EQ(f->task.payload(), v1::Task::MODEL);
  v1::TensorBundle mb = fetch_bundle(*f);
  EXPECT_EQ(mb.tensors_size(), 2 + 2 + 2 + 1);
  AdamState state;
  auto took = TakeOptimizerState(layout_, *codecs_, &mb, &state);
  ASSERT_THAT(took, IsOk());
  ASSERT_TRUE(*took);
  std::vector<float> copy(1025);
  ASSERT_THAT(BundleToFlat(mb, layout_, *codecs_, absl::MakeSpan(copy)), IsOk());
  EXPECT_EQ(copy, ModelOf(*a));
  for (float v : state.v) EXPECT_GT(v, 0.0f);  // frozen, bias-corrected
  const uint32_t crc2 = Crc32(copy.data(), 4 * copy.size());
  const uint64_t down_before = a->Status(kT0).payload_bytes_down();
  // Clients push their own momentum, 1-bit encoded.
  for (int round = 3; round <= 4; ++round) {
    for (uint32_t c = 0; c < 3; ++c) {
      std::vector<float> m = grad(c, round);
      for (size_t i = 0; i < m.size(); ++i) m[i] = 0.9f * state.m[i] + 0.1f * m[i];
      v1::UpdateInfo info;
      info.set_client_id(c);
      info.set_round(static_cast<uint64_t>(round));
      info.set_weight(1);
      ASSERT_THAT(a->Push(info, Update(m, round, "sign"), 100, kT0), IsOk());
    }
    ASSERT_THAT(a->Tick(kT0), IsOk());
    if (round == 3) {
      // A client holding round 2 and the state catches up from the 1-bit mean momentum alone.
      f = a->Fetch(0, kT0, 2, crc2, /*have_state=*/true);
      ASSERT_THAT(f, IsOk());
      ASSERT_EQ(f->task.payload(), v1::Task::DELTAS);
      ASSERT_THAT(ApplyOnebitDeltas(fetch_bundle(*f), layout_, *codecs_, f->task, &state,
                                    absl::MakeSpan(copy)),
                  IsOk());
      EXPECT_EQ(copy, ModelOf(*a));  // bit-identical
      EXPECT_EQ(Crc32(copy.data(), 4 * copy.size()), f->task.model_crc32());
      // One round's downstream: ~1 bit a coordinate (plus a scale per chunk), not 32.
      EXPECT_LT(a->Status(kT0).payload_bytes_down() - down_before, 4u * 1025 / 20);
      // Without the state the updates are useless: the model (and state) again.
      EXPECT_EQ(ValueOrFailure(a->Fetch(1, kT0, 3, f->task.model_crc32(), false)).task.payload(),
                v1::Task::MODEL);
    }
  }
  // The model moved against the mean momentum (every coordinate, by about lr each round).
  const std::vector<float> x = ModelOf(*a);
  EXPECT_NE(x, copy);
}

TEST_F(AggregatorTest, MajorityVoteStepsByTheVoteAndSendsItDownAsOneBitACoordinate) {
  layout_ = {ParamTensor{"w", {40, 25}, 0, 1000}, ParamTensor{"b", {25}, 1000, 25}};
  x0_.resize(1025);
  for (size_t i = 0; i < x0_.size(); ++i) x0_[i] = std::sin(0.1f * static_cast<float>(i));
  options_.mode = "ps";
  options_.rule = "majority-vote";
  options_.total_rounds = 4;
  v1::GradientStep* step = options_.task.mutable_gradient();
  step->set_batch(8);
  step->set_lr(0.01f);
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  auto fetch_bundle = [&](const FetchResult& f) {
    BundleAssembler assembler(1 << 24);
    for (const v1::BundleChunk& c : *f.chunks) EXPECT_THAT(assembler.Add(c), IsOk());
    return ValueOrFailure(assembler.Finish());
  };
  auto f = a->Fetch(0, kT0);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->task.update_codec(), "sign");  // signs up, without error feedback
  EXPECT_FALSE(f->task.error_feedback());
  std::vector<float> copy(1025);
  ASSERT_THAT(BundleToFlat(fetch_bundle(*f), layout_, *codecs_, absl::MakeSpan(copy)), IsOk());
  const uint32_t crc = Crc32(copy.data(), 4 * copy.size());
  // Two honest clients agree in sign; the third sends every sign flipped, a thousand times louder.
  std::vector<float> g(1025), vote(1025);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = std::cos(0.37f * static_cast<float>(i));
    vote[i] = g[i] > 0 ? 1.0f : -1.0f;
  }
  std::vector<float> liar = g;
  for (float& v : liar) v *= -1000;
  const uint64_t down_before = a->Status(kT0).payload_bytes_down();
  for (uint32_t c = 0; c < 3; ++c) {
    v1::UpdateInfo info;
    info.set_client_id(c);
    info.set_round(1);
    info.set_weight(1);
    ASSERT_THAT(a->Push(info, Update(c == 2 ? liar : g, 1, "sign"), 100, kT0), IsOk());
  }
  ASSERT_THAT(a->Tick(kT0), IsOk());
  // The model moved by lr against the honest sign, every coordinate.
  const std::vector<float> x = ModelOf(*a);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(x[i], x0_[i] - 0.01f * vote[i], 1e-6) << i;
  }
  // A client holding round 0 catches up from the vote, bit for bit, in about a bit a coordinate.
  f = a->Fetch(0, kT0, 0, crc);
  ASSERT_THAT(f, IsOk());
  ASSERT_EQ(f->task.payload(), v1::Task::DELTAS);
  const v1::TensorBundle down = fetch_bundle(*f);
  for (const v1::NamedTensor& t : down.tensors()) EXPECT_EQ(t.tensor().codec(), "sign.v1");
  ASSERT_THAT(ApplyDeltas(down, layout_, *codecs_, absl::MakeSpan(copy)), IsOk());
  EXPECT_EQ(copy, x);
  EXPECT_EQ(Crc32(copy.data(), 4 * copy.size()), f->task.model_crc32());
  EXPECT_LT(a->Status(kT0).payload_bytes_down() - down_before, 1025 / 8 + 2 * (4 + 4 + 8));
}

// ps with --lr_schedule: round r steps at the schedule's rate, outside the momentum (as torch's
// schedulers scale SGD's lr), and the status says which rate the round took.
TEST_F(AggregatorTest, PsStepsAtTheScheduledRateOfEachRoundOutsideTheMomentum) {
  options_.mode = "ps";
  options_.total_rounds = 3;
  options_.server_momentum = 0.9;
  options_.lr_schedule = "step:every=1,gamma=0.5";
  v1::GradientStep* step = options_.task.mutable_gradient();
  step->set_batch(8);
  step->set_lr(0.5f);
  step->set_optimizer("sgd");
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  const std::vector<float> g = {1, -2, 0.5f, 4, 0, -1, 2, 1, -0.25f};
  std::vector<float> x = x0_, m(g.size(), 0.0f);
  float lr = 0.5f;
  for (int round = 1; round <= 3; ++round, lr *= 0.5f) {
    for (uint32_t c = 0; c < 3; ++c) ASSERT_THAT(Push(*a, c, round, 1, g), IsOk());
    ASSERT_THAT(a->Tick(kT0), IsOk());
    for (size_t i = 0; i < x.size(); ++i) {
      m[i] = 0.9f * m[i] + g[i];
      x[i] -= lr * m[i];
    }
    const std::vector<float> got = ModelOf(*a);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(got[i], x[i], 1e-5) << round << " " << i;
    EXPECT_DOUBLE_EQ(a->Status(kT0).lr(), lr);
  }
}

TEST_F(AggregatorTest, PsAdamStepsAsAdamAtEachRoundsScheduledRate) {
  options_.mode = "ps";
  options_.total_rounds = 4;
  options_.lr_schedule = "cosine:warmup=1";
  v1::GradientStep* step = options_.task.mutable_gradient();
  step->set_batch(8);
  step->set_lr(0.01f);
  step->set_optimizer("adam");
  step->set_beta1(0.9f);
  step->set_eps(1e-8f);
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  const LrSchedule lr = ValueOrFailure(ParseLrSchedule("cosine:warmup=1", 0.01f, 4));
  AdamState state;
  state.Reset(x0_.size(), layout_.size());
  std::vector<float> x = x0_;
  for (int round = 1; round <= 3; ++round) {
    std::vector<float> g(9);
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::cos(0.7f * static_cast<float>(i) + round);
    for (uint32_t c = 0; c < 3; ++c) ASSERT_THAT(Push(*a, c, round, 1, g), IsOk());
    ASSERT_THAT(a->Tick(kT0), IsOk());
    AdamSettings s{.lr = static_cast<float>(0.01f * lr.Scale(round - 1)),
                   .beta1 = 0.9f,
                   .beta2 = options_.beta2,
                   .eps = 1e-8f};
    std::vector<float> d(x.size());
    AdamStep(s, layout_, x, g, &state, absl::MakeSpan(d));
    for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
    EXPECT_EQ(ModelOf(*a), x) << "round " << round;
  }
  EXPECT_NEAR(a->Status(kT0).lr(), lr.At(2), 1e-12);
}

// federated (and local-sgd, fedbuff): each round's task carries the round's local rate.
TEST_F(AggregatorTest, EachRoundsTaskCarriesTheScheduledLocalRate) {
  options_.lr_schedule = "cosine:min=0.01";
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  const LrSchedule lr = ValueOrFailure(ParseLrSchedule("cosine:min=0.01", 0.1f, 5));
  for (int round = 1; round <= 3; ++round) {
    const FetchResult f = ValueOrFailure(a->Fetch(0, kT0));
    ASSERT_EQ(f.task.kind(), v1::Task::TRAIN);
    EXPECT_FLOAT_EQ(f.task.local().lr(), static_cast<float>(lr.At(round - 1))) << round;
    for (uint32_t c = 0; c < 3; ++c)
      ASSERT_THAT(Push(*a, c, round, 1, std::vector<float>(9, 0)), IsOk());
    ASSERT_THAT(a->Tick(kT0), IsOk());
    EXPECT_NEAR(a->Status(kT0).lr(), lr.At(round - 1), 1e-12);
  }
  EXPECT_LT(lr.At(2), 0.1);
}

TEST_F(AggregatorTest, AnUnscheduledRunHandsOutTheTasksOwnRate) {
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(ValueOrFailure(a->Fetch(0, kT0)).task.local().lr(), 0.1f);
  for (uint32_t c = 0; c < 3; ++c) ASSERT_THAT(Push(*a, c, 1, 1, std::vector<float>(9, 0)), IsOk());
  ASSERT_THAT(a->Tick(kT0), IsOk());
  EXPECT_EQ(ValueOrFailure(a->Fetch(0, kT0)).task.local().lr(), 0.1f);
  EXPECT_EQ(a->Status(kT0).lr(), static_cast<double>(0.1f));
}

TEST_F(AggregatorTest, AScheduleIsRefusedWhereItCannotApply) {
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.lr_schedule = "linear"; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lr_schedule=linear")));
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.lr_schedule = "cosine:min=1"; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lr_schedule")));
  EXPECT_THAT(Normalized([](AggregatorOptions& o) {
                o.lr_schedule = "cosine";
                o.edge_rounds = 2;
              }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("parent")));
  EXPECT_THAT(Normalized([](AggregatorOptions& o) {
                o.lr_schedule = "constant";
                o.edge_rounds = 2;
              }),
              IsOk());
  auto onebit = [](AggregatorOptions& o) {
    o.mode = "ps";
    o.lr_schedule = "constant:warmup=3";
    v1::GradientStep* g = o.task.mutable_gradient();
    g->set_batch(8);
    g->set_lr(0.01f);
    g->set_optimizer("onebit-adam");
    g->set_warmup_rounds(2);
    g->set_beta1(0.9f);
    g->set_eps(1e-8f);
  };
  EXPECT_THAT(Normalized(onebit),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not built")));
}

TEST(AggregatorOptionsTest, MajorityVoteIsRefusedWhereItCannotVote) {
  auto codecs = NewBuiltinCodecRegistry();
  AggregatorOptions ps;
  ps.mode = "ps";
  ps.rule = "majority-vote";
  ps.task.mutable_gradient()->set_batch(8);
  ps.task.mutable_gradient()->set_lr(0.01f);
  ps.task.set_update_codec("none");
  const AggregatorOptions ok = ValueOrFailure(NormalizeAggregatorOptions(ps, *codecs));
  EXPECT_EQ(ok.task.update_codec(), "sign");
  EXPECT_EQ(ok.downstream, "delta");
  EXPECT_EQ(ok.downstream_codec, "sign:chunk=1073741824");
  AggregatorOptions signum = ps;
  signum.task.set_memory("momentum:beta=0.9");
  EXPECT_THAT(NormalizeAggregatorOptions(signum, *codecs), IsOk());
  AggregatorOptions bad = ps;
  bad.task.set_error_feedback(true);
  EXPECT_THAT(NormalizeAggregatorOptions(bad, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("error feedback")));
  bad = ps;
  bad.task.set_memory("ef");
  EXPECT_THAT(NormalizeAggregatorOptions(bad, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("error feedback")));
  bad = ps;
  bad.server_momentum = 0.9;
  EXPECT_THAT(NormalizeAggregatorOptions(bad, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--server_momentum")));
  bad = ps;
  bad.task.mutable_gradient()->set_optimizer("adam");
  bad.task.mutable_gradient()->set_beta1(0.9f);
  bad.task.mutable_gradient()->set_eps(1e-8f);
  EXPECT_THAT(NormalizeAggregatorOptions(bad, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--optimizer=sgd")));
  bad = ps;
  bad.task.set_memory("momentum:beta=1.5");
  EXPECT_THAT(NormalizeAggregatorOptions(bad, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("beta")));
  AggregatorOptions fed;
  fed.rule = "majority-vote";
  fed.task.mutable_local()->set_local_epochs(1);
  fed.task.mutable_local()->set_batch(8);
  fed.task.mutable_local()->set_lr(0.1f);
  fed.task.set_update_codec("none");
  EXPECT_THAT(NormalizeAggregatorOptions(fed, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--mode=ps")));
  // A malformed rule is left to the registry, which names the rules it knows.
  ServerRegistries registries = NewBuiltinServerRegistries();
  AggregatorOptions malformed = ps;
  malformed.rule = "majority vote";
  EXPECT_THAT(Aggregator::Create(malformed, &registries, absl::Now()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(AggregatorOptionsTest, BadOptionsAreRefusedWithAReason) {
  auto codecs = NewBuiltinCodecRegistry();
  AggregatorOptions o;
  o.task.mutable_local()->set_local_epochs(1);
  o.task.mutable_local()->set_batch(8);
  o.task.mutable_local()->set_lr(0.1f);
  o.task.set_update_codec("none");
  EXPECT_THAT(NormalizeAggregatorOptions(o, *codecs), IsOk());
  AggregatorOptions bad = o;
  bad.mode = "gossip";
  EXPECT_THAT(NormalizeAggregatorOptions(bad, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mode")));
  bad = o;
  bad.task.set_update_codec("nope");
  EXPECT_FALSE(NormalizeAggregatorOptions(bad, *codecs).ok());
  bad = o;
  bad.server_momentum = 1.0;
  EXPECT_FALSE(NormalizeAggregatorOptions(bad, *codecs).ok());
  bad = o;
  bad.task.mutable_local()->set_anchor_pull(
      0.5f);  // federated: clients sampled per round keep no model
  EXPECT_THAT(NormalizeAggregatorOptions(bad, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("local-sgd")));
  bad.mode = "local-sgd";
  EXPECT_THAT(NormalizeAggregatorOptions(bad, *codecs), IsOk());
  bad.task.mutable_local()->set_anchor_pull(1.5f);
  EXPECT_FALSE(NormalizeAggregatorOptions(bad, *codecs).ok());
  // The work must match the mode: ps takes gradients, the others local training.
  auto ps = o;
  ps.mode = "ps";
  EXPECT_THAT(NormalizeAggregatorOptions(ps, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Task.gradient")));
  ps.task.mutable_gradient()->set_batch(8);
  ps.task.mutable_gradient()->set_lr(0.1f);
  EXPECT_THAT(NormalizeAggregatorOptions(ps, *codecs), IsOk());
  ps.task.mutable_gradient()->set_optimizer("onebit-adam");  // without warm-up rounds
  ps.task.mutable_gradient()->set_eps(1e-8f);
  EXPECT_THAT(NormalizeAggregatorOptions(ps, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("warmup")));
  bad = o;
  bad.mode = "local-sgd";
  bad.task.mutable_gradient()->set_batch(8);
  EXPECT_THAT(NormalizeAggregatorOptions(bad, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Task.local")));
}

// One blown-up client cannot wreck FedAvg: once three updates were accepted, an update over 10x
// their median norm is refused (the flag named), and the round closes on the others.
TEST_F(AggregatorTest, AnUpdateFarAboveTheRecentNormsIsRefusedUnlessTheGuardIsOff) {
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  for (uint32_t c = 0; c < 3; ++c) EXPECT_THAT(Push(*a, c, 1, 1, std::vector<float>(9, 1)), IsOk());
  ASSERT_THAT(a->Tick(kT0), IsOk());
  EXPECT_THAT(Push(*a, 0, 2, 1, std::vector<float>(9, 1e30f)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--norm_guard")));
  // Its turn is spent (no second draw); 2x from another client is fine.
  EXPECT_THAT(Push(*a, 0, 2, 1, std::vector<float>(9, 2)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(Push(*a, 1, 2, 1, std::vector<float>(9, 2)), IsOk());
  EXPECT_THAT(Push(*a, 2, 2, 1, std::vector<float>(9, 1)), IsOk());
  ASSERT_THAT(a->Tick(kT0), IsOk());
  for (float v : ModelOf(*a)) EXPECT_LT(std::abs(v), 100.0f);

  options_.norm_guard.factor = 0;
  auto off = Start(3);
  ASSERT_NE(off, nullptr);
  for (uint32_t c = 0; c < 3; ++c) {
    EXPECT_THAT(Push(*off, c, 1, 1, std::vector<float>(9, 1)), IsOk());
  }
  ASSERT_THAT(off->Tick(kT0), IsOk());
  EXPECT_THAT(Push(*off, 0, 2, 1, std::vector<float>(9, 1e30f)), IsOk());
}

}  // namespace
}  // namespace tern
