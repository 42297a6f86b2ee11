// The C++ client library with a model of the caller's own: participants whose local work
// minimizes 0.5 ||x - t_i||^2 against an in-process `tern server` service, on threads. FedAvg
// and the parameter server both have the examples-weighted mean of the targets as their fixed
// point, so the final model must land there.
#include "clients/cpp/aggregator_client.h"

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/service.h"
#include "tests/testing/quadratic_participant.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::QuadraticParticipant;
using ::tern::testing::StatusIs;

struct QuadraticRun {
  std::vector<float> model;     // the server's final model
  std::vector<float> expected;  // the examples-weighted mean of the targets
  std::vector<absl::StatusOr<FedClientStats>> stats;
};

QuadraticRun RunQuadratic(const std::string& mode, const std::string& codec, bool error_feedback,
                          int rounds, bool break_one = false, bool same_target = false,
                          std::vector<bool> exact = {}) {
  QuadraticRun run;
  const ServerRegistries registries = NewBuiltinServerRegistries();
  ServerOptions so;
  AggregatorOptions& a = so.aggregator;
  a.run_id = "mine";
  a.mode = mode;
  a.min_clients = 3;
  a.total_rounds = rounds;
  a.policy.clients_per_round = 3;
  a.policy.min_replies = break_one ? 2 : 3;
  a.policy.deadline = absl::Seconds(break_one ? 2 : 60);
  a.policy.grace = absl::Milliseconds(100);
  a.task.set_update_codec(codec);
  a.task.set_error_feedback(error_feedback);
  a.task.set_seed(5);
  if (mode == "ps") {
    a.task.mutable_gradient()->set_batch(1);
    a.task.mutable_gradient()->set_lr(0.5f);
    a.task.mutable_gradient()->set_optimizer("sgd");
  } else {
    a.task.mutable_local()->set_local_steps(3);
    a.task.mutable_local()->set_lr(0.5f);
    a.task.mutable_local()->set_batch(1);
  }
  auto server = AggregatorServer::Start(so, &registries);
  EXPECT_THAT(server, IsOk());
  if (!server.ok()) return run;
  std::vector<std::vector<float>> targets = {
      {1, 2, 3, 4, 5, 6, 7, 8}, {-1, 0, 1, 0, -1, 0, 1, 0}, {4, 4, 4, 4, -4, -4, -4, -4}};
  if (same_target) targets.assign(3, targets[0]);
  const std::vector<uint64_t> examples = {100, 200, 300};
  run.expected.assign(8, 0.0f);
  for (size_t c = 0; c < 3; ++c) {
    for (size_t i = 0; i < 8; ++i) run.expected[i] += targets[c][i] * examples[c] / 600.0f;
  }
  std::vector<std::unique_ptr<QuadraticParticipant>> participants;
  for (size_t c = 0; c < 3; ++c) {
    participants.push_back(std::make_unique<QuadraticParticipant>(targets[c], examples[c]));
  }
  if (break_one) participants[2]->Break();
  for (auto& p : participants) p->SetExact(exact);
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  std::atomic<bool> stop{false};
  run.stats.assign(3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t c = 0; c < 3; ++c) {
    threads.emplace_back([&, c] {
      AggregatorClientOptions o;
      o.run_id = "mine";
      o.name = absl::StrCat("mine-", c);
      o.fetch_wait = absl::Milliseconds(200);
      run.stats[c] = RunAggregatorClient(address, TlsFiles{}, o, participants[c].get(), stop);
    });
  }
  (*server)->WaitDone();
  for (std::thread& t : threads) t.join();
  auto kept = (*server)->aggregator().Model(rounds);
  EXPECT_THAT(kept, IsOk());
  if (kept.ok()) {
    const std::vector<ParamTensor> layout = (*server)->aggregator().layout();
    EXPECT_EQ(layout.size(), 2u);  // the participant's layout, as the server keeps it
    run.model.resize(LayoutNumel(layout));
    EXPECT_THAT(BundleToFlat(*kept->bundle, layout, *registries.codecs, absl::MakeSpan(run.model)),
                IsOk());
  }
  (*server)->Shutdown(absl::Seconds(1));
  return run;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double{a[i]} - b[i]));
  return d;
}

TEST(AggregatorClient, YourModelReachesTheWeightedMeanInAFederatedRun) {
  const QuadraticRun run = RunQuadratic("federated", "none", false, 20);
  ASSERT_EQ(run.model.size(), 8u);
  EXPECT_LT(MaxDiff(run.model, run.expected), 1e-4);
  for (const auto& s : run.stats) {
    ASSERT_THAT(s, IsOk());
    EXPECT_EQ(s->rounds_trained, 20);
    EXPECT_EQ(s->updates_accepted, 20);
  }
}

TEST(AggregatorClient, YourGradientsReachTheWeightedMeanInAPsRun) {
  const QuadraticRun run = RunQuadratic("ps", "none", false, 40);
  ASSERT_EQ(run.model.size(), 8u);
  EXPECT_LT(MaxDiff(run.model, run.expected), 1e-4);
}

// The library encodes with the task's codec and keeps error feedback's residual between rounds:
// top-k of half the values still gets there. (With targets that differ, the iterate stays off
// the mean by the residuals the clients hold, O(their updates); the same target makes those
// vanish.)
TEST(AggregatorClient, ACompressedUpdateWithErrorFeedbackStillGetsThere) {
  const QuadraticRun run = RunQuadratic("federated", "topk:ratio=0.5", true, 40,
                                        /*break_one=*/false, /*same_target=*/true);
  ASSERT_EQ(run.model.size(), 8u);
  EXPECT_LT(MaxDiff(run.model, run.expected), 1e-4);
}

// A tensor the participant marks exact goes whole, outside error feedback: with targets that
// differ, the compressed tensor stays off the mean by the residuals the clients hold, the exact
// one lands on it.
TEST(AggregatorClient, ExactTensorsAreSentWholeOutsideErrorFeedback) {
  for (const bool exact_b : {false, true}) {
    const QuadraticRun run = RunQuadratic(
        "federated", "topk:ratio=0.5", true, 30, /*break_one=*/false,
        /*same_target=*/false, exact_b ? std::vector<bool>{false, true} : std::vector<bool>{});
    ASSERT_EQ(run.model.size(), 8u);
    double w = 0, b = 0;
    for (size_t i = 0; i < 8; ++i) {
      (i < 6 ? w : b) = std::max(i < 6 ? w : b, std::abs(double{run.model[i]} - run.expected[i]));
    }
    EXPECT_GT(w, 0.1);  // measured: 0.78 either way
    if (exact_b) {
      EXPECT_LT(b, 1e-4);  // measured: 1.8e-7
    } else {
      EXPECT_GT(b, 0.1);  // measured: 0.44
    }
  }
}

// A participant that returns an update of the wrong size stops its own client with the reason;
// the others finish the run.
TEST(AggregatorClient, AnUpdateOfTheWrongSizeStopsThatClientWithTheReason) {
  const QuadraticRun run = RunQuadratic("federated", "none", false, 3, /*break_one=*/true);
  EXPECT_THAT(run.stats[2], StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(run.stats[2].status().message(), ::testing::HasSubstr("7 values; the model has 8"));
  EXPECT_THAT(run.stats[0], IsOk());
  EXPECT_THAT(run.stats[1], IsOk());
}

}  // namespace
}  // namespace tern
