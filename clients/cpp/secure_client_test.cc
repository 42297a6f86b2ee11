// The C++ client library in a securely aggregated run: ten participants of the in-process
// `tern server` service, two of which lose their masked update (their work ends after the round),
// and the server's model after the round is the mean of the eight others' updates, which it
// never saw one by one.
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

TEST(SecureAggregatorClient, TenClientsTwoLostAfterMaskingGiveTheOtherEightsMean) {
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
  auto server = AggregatorServer::Start(so, &registries);
  ASSERT_THAT(server, IsOk());
  std::vector<std::unique_ptr<QuadraticParticipant>> participants;
  std::vector<std::vector<float>> targets;
  for (int c = 0; c < 10; ++c) {
    std::vector<float> t(8);
    for (int i = 0; i < 8; ++i) t[i] = std::sin(static_cast<float>(7 * c + i)) * 8.0f;
    targets.push_back(t);
    if (c < 2) {
      participants.push_back(std::make_unique<LateParticipant>(
          t, 100 + c, [&] { return (*server)->aggregator().Counters().round() >= 1; }));
    } else {
      participants.push_back(std::make_unique<QuadraticParticipant>(t, 100 + c));
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
      stats[c] = RunAggregatorClient(address, TlsFiles{}, o, participants[c].get(), stop);
    });
  }
  (*server)->WaitDone();
  for (std::thread& t : threads) t.join();
  for (const auto& s : stats) EXPECT_THAT(s, IsOk());
  const v1::ServerStatus st = (*server)->aggregator().Status(absl::Now());
  EXPECT_EQ(st.round(), 1u);
  EXPECT_EQ(st.last_round_updates(), 8u);
  EXPECT_EQ(st.secagg_dropped(), 2u);
  EXPECT_EQ(st.secagg_failed_rounds(), 0u);
  auto kept = (*server)->aggregator().Model(1);
  ASSERT_THAT(kept, IsOk());
  std::vector<float> x(8);
  ASSERT_THAT(
      BundleToFlat(*kept->bundle, participants[0]->Layout(), *registries.codecs, absl::MakeSpan(x)),
      IsOk());
  // x0 + the unweighted mean of the eight on-time updates (3 steps at 0.5 from x0).
  std::vector<float> x0(8);
  ASSERT_THAT(participants[0]->InitialModel(absl::MakeSpan(x0)), IsOk());
  const double step = 2.0 * 16 / ((uint64_t{1} << 32) - 1) * 10;  // levels for 10 clients
  for (int i = 0; i < 8; ++i) {
    double mean = 0;
    for (int c = 2; c < 10; ++c) {
      const std::vector<float> end = participants[c]->Pull(x0, 3, 0.5f);
      mean += (end[i] - x0[i]) / 8.0;
    }
    EXPECT_NEAR(x[i], x0[i] + mean, step + 1e-5) << i;
  }
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace tern
