// The C++ client library in a securely aggregated run: ten participants of the in-process
// `tern server` service, two of which lose their masked update (their work ends after the round),
// and the server's model after the round is the mean of the eight others' updates, which it
// never saw one by one; with DP-FedAvg, each client's clipped update plus its share of the noise,
// summed over the ten sampled.
#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "clients/cpp/aggregator_client.h"
#include "core/model/bundle.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/service.h"
#include "tests/testing/quadratic_participant.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::QuadraticParticipant;

// A participant whose work ends only once the round has closed (or after a minute): its masked
// update comes too late, however slow the machine.
class LateParticipant : public QuadraticParticipant {
 public:
  LateParticipant(std::vector<float> target, uint64_t examples, std::function<bool()> closed)
      : QuadraticParticipant(std::move(target), examples), closed_(std::move(closed)) {}
  absl::StatusOr<WorkResult> Work(const v1::Task& task, const std::vector<float>& global,
                                  const WorkContext& context) override {
    const absl::Time give_up = absl::Now() + absl::Minutes(1);
    while (!closed_() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
    return QuadraticParticipant::Work(task, global, context);
  }

 private:
  std::function<bool()> closed_;
};

// Ten clients of an in-process server, one round; clients 0 and 1 mask too late. What the
// server ended with, and the participants (their targets are their updates' direction).
struct TenClientRound {
  v1::ServerStatus status;
  std::vector<float> x0, x;  // the model before and after the round
  std::vector<std::unique_ptr<QuadraticParticipant>> participants;
};

void RunTenClients(const std::function<void(AggregatorOptions&)>& tweak, TenClientRound* run) {
  const ServerRegistries registries = NewBuiltinServerRegistries();
  ServerOptions so;
  so.tick = absl::Milliseconds(10);
  AggregatorOptions& a = so.aggregator;
  a.run_id = "secure";
  a.min_clients = 10;
  a.total_rounds = 1;
  a.policy.clients_per_round = 10;
  a.policy.min_replies = 8;
  a.policy.grace = absl::Milliseconds(100);
  a.policy.deadline = absl::Seconds(60);
  a.task.set_update_codec("none");
  a.task.mutable_local()->set_local_steps(3);
  a.task.mutable_local()->set_lr(0.5f);
  a.task.mutable_local()->set_batch(1);
  a.secagg.enabled = true;
  a.secagg.neighbours = 6;
  a.secagg.range = 16;
  tweak(a);
  auto server = AggregatorServer::Start(so, &registries);
  ASSERT_THAT(server, IsOk());
  for (int c = 0; c < 10; ++c) {
    std::vector<float> t(8);
    for (int i = 0; i < 8; ++i) t[i] = std::sin(static_cast<float>(7 * c + i)) * 8.0f;
    if (c < 2) {
      run->participants.push_back(std::make_unique<LateParticipant>(
          t, 100 + c, [&] { return (*server)->aggregator().Counters().round() >= 1; }));
    } else {
      run->participants.push_back(std::make_unique<QuadraticParticipant>(t, 100 + c));
    }
  }
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  std::atomic<bool> stop{false};
  std::vector<absl::StatusOr<FedClientStats>> stats(10, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int c = 0; c < 10; ++c) {
    threads.emplace_back([&, c] {
      AggregatorClientOptions o;
      o.run_id = "secure";
      o.name = absl::StrCat("secure-", c);
      o.fetch_wait = absl::Milliseconds(200);
      stats[c] = RunAggregatorClient(address, TlsFiles{}, o, run->participants[c].get(), stop);
    });
  }
  (*server)->WaitDone();
  for (std::thread& t : threads) t.join();
  for (const auto& s : stats) EXPECT_THAT(s, IsOk());
  run->status = (*server)->aggregator().Status(absl::Now());
  auto kept = (*server)->aggregator().Model(1);
  ASSERT_THAT(kept, IsOk());
  run->x.assign(8, 0.0f);
  ASSERT_THAT(BundleToFlat(*kept->bundle, run->participants[0]->Layout(), *registries.codecs,
                           absl::MakeSpan(run->x)),
              IsOk());
  run->x0.assign(8, 0.0f);
  ASSERT_THAT(run->participants[0]->InitialModel(absl::MakeSpan(run->x0)), IsOk());
  (*server)->Shutdown(absl::Seconds(1));
}

TEST(SecureAggregatorClient, TenClientsTwoLostAfterMaskingGiveTheOtherEightsMean) {
  TenClientRound run;
  ASSERT_NO_FATAL_FAILURE(RunTenClients([](AggregatorOptions&) {}, &run));
  EXPECT_EQ(run.status.round(), 1u);
  EXPECT_EQ(run.status.last_round_updates(), 8u);
  EXPECT_EQ(run.status.secagg_dropped(), 2u);
  EXPECT_EQ(run.status.secagg_failed_rounds(), 0u);
  // x0 + the unweighted mean of the eight on-time updates (3 steps at 0.5 from x0).
  const double step = 2.0 * 16 / ((uint64_t{1} << 32) - 1) * 10;  // levels for 10 clients
  for (int i = 0; i < 8; ++i) {
    double mean = 0;
    for (int c = 2; c < 10; ++c) {
      const std::vector<float> end = run.participants[c]->Pull(run.x0, 3, 0.5f);
      mean += (end[i] - run.x0[i]) / 8.0;
    }
    EXPECT_NEAR(run.x[i], run.x0[i] + mean, step + 1e-5) << i;
  }
}

TEST(SecureAggregatorClient, WithRandomKOnlyTheRoundsKeptHalfOfTheModelMoves) {
  TenClientRound run;
  ASSERT_NO_FATAL_FAILURE(RunTenClients(
      [](AggregatorOptions& a) { a.task.set_update_codec("randomk:ratio=0.5"); }, &run));
  EXPECT_EQ(run.status.last_round_updates(), 8u);
  // 4 of the 8 values (the same 4 for every client) moved by the eight's mean; 4 stayed.
  const double step = 2.0 * 16 / ((uint64_t{1} << 32) - 1) * 10;
  int moved = 0;
  for (int i = 0; i < 8; ++i) {
    if (run.x[i] == run.x0[i]) continue;
    ++moved;
    double mean = 0;
    for (int c = 2; c < 10; ++c) {
      const std::vector<float> end = run.participants[c]->Pull(run.x0, 3, 0.5f);
      mean += (end[i] - run.x0[i]) / 8.0;
    }
    EXPECT_NEAR(run.x[i], run.x0[i] + mean, step + 1e-5) << i;
  }
  EXPECT_EQ(moved, 4);
}

TEST(SecureAggregatorClient, WithDpEachClientClipsAndAddsItsShareOfTheNoise) {
  TenClientRound run;
  ASSERT_NO_FATAL_FAILURE(RunTenClients(
      [](AggregatorOptions& a) {
        a.dp.clip = 1.0;
        a.dp.noise = 1e-3;  // each client's sd 1e-3 / sqrt(10): the mean's under 1e-4
      },
      &run));
  EXPECT_EQ(run.status.last_round_updates(), 8u);
  // z spent as 8 of 10 clients' noise: 1e-3 sqrt(0.8), an enormous epsilon but a finite one.
  EXPECT_GT(run.status.dp_epsilon(), 0);
  // x0 + the eight updates, each clipped to norm 1 by its client, summed over the 10 sampled.
  for (int i = 0; i < 8; ++i) {
    double sum = 0;
    for (int c = 2; c < 10; ++c) {
      std::vector<float> d = run.participants[c]->Pull(run.x0, 3, 0.5f);
      double sq = 0;
      for (int j = 0; j < 8; ++j) {
        d[j] -= run.x0[j];
        sq += static_cast<double>(d[j]) * d[j];
      }
      ASSERT_GT(std::sqrt(sq), 1.0);  // every update is over the clip
      sum += d[i] / std::sqrt(sq);
    }
    EXPECT_NEAR(run.x[i], run.x0[i] + sum / 10, 1e-3) << i;
  }
}

}  // namespace
}  // namespace tern
