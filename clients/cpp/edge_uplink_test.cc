// Edge aggregators against real in-process services: two edges, each the parent's client for
// two participants of its own, give the parent the model a flat FedAvg run of the four would
// reach, with the parent's codec on the uplinks and the edges' own below them.
#include "clients/cpp/edge_uplink.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
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

constexpr int kLocalSteps = 3;
constexpr float kLocalLr = 0.5f;

ServerOptions TierOptions(int clients, int rounds, const std::string& codec) {
  ServerOptions so;
  AggregatorOptions& a = so.aggregator;
  a.run_id = "tiers";
  a.min_clients = clients;
  a.total_rounds = rounds;
  a.policy.clients_per_round = clients;
  a.policy.min_replies = clients;
  a.policy.grace = absl::Milliseconds(50);
  a.task.set_update_codec(codec);
  a.task.mutable_local()->set_local_steps(kLocalSteps);
  a.task.mutable_local()->set_lr(kLocalLr);
  a.task.mutable_local()->set_batch(1);
  return so;
}

TEST(EdgeUplink, TwoEdgesGiveTheParentTheFlatRunsModelWithEachTiersOwnCodec) {
  constexpr int kRounds = 4;
  const ServerRegistries registries = NewBuiltinServerRegistries();
  // The uplinks (edge to parent) in fp16, the edges' clients uncompressed.
  auto parent = AggregatorServer::Start(TierOptions(2, kRounds, "fp16"), &registries);
  ASSERT_THAT(parent, IsOk());
  const std::string parent_address = absl::StrCat("127.0.0.1:", (*parent)->port());
  std::vector<std::unique_ptr<AggregatorServer>> edges;
  for (int e = 0; e < 2; ++e) {
    ServerOptions so = TierOptions(2, 1, "none");
    so.aggregator.edge_rounds = 1;
    auto edge = AggregatorServer::Start(so, &registries);
    ASSERT_THAT(edge, IsOk());
    edges.push_back(*std::move(edge));
  }
  const std::vector<std::vector<float>> targets = {{1, 2, 3, 4, 5, 6, 7, 8},
                                                   {-1, 0, 1, 0, -1, 0, 1, 0},
                                                   {4, 4, 4, 4, -4, -4, -4, -4},
                                                   {0, 0, 2, 2, 0, 0, -2, -2}};
  const std::vector<uint64_t> examples = {100, 200, 300, 400};
  std::vector<std::unique_ptr<QuadraticParticipant>> pullers;
  for (size_t c = 0; c < 4; ++c) {
    pullers.push_back(std::make_unique<QuadraticParticipant>(targets[c], examples[c]));
  }

  std::atomic<bool> stop{false};
  std::vector<absl::Status> uplinks(2, absl::UnknownError("not run"));
  std::vector<absl::StatusOr<FedClientStats>> stats(4, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int e = 0; e < 2; ++e) {
    threads.emplace_back([&, e] {
      AggregatorClientOptions o;
      o.run_id = "tiers";
      o.name = absl::StrCat("edge-", e);
      o.fetch_wait = absl::Milliseconds(200);
      uplinks[e] = RunEdgeUplink(&edges[e]->aggregator(), parent_address, TlsFiles{}, o, stop);
    });
  }
  for (size_t c = 0; c < 4; ++c) {
    threads.emplace_back([&, c] {
      AggregatorClientOptions o;
      o.run_id = "tiers";
      o.name = absl::StrCat("client-", c);
      o.fetch_wait = absl::Milliseconds(200);
      stats[c] = RunAggregatorClient(absl::StrCat("127.0.0.1:", edges[c / 2]->port()), TlsFiles{},
                                     o, pullers[c].get(), stop);
    });
  }
  (*parent)->WaitDone();
  for (auto& edge : edges) edge->WaitDone();  // the parent's end is theirs
  for (std::thread& t : threads) t.join();

  // A flat FedAvg run of the four, by hand.
  std::vector<float> expected(8);
  for (size_t i = 0; i < 8; ++i) expected[i] = 0.1f * static_cast<float>(i);
  for (int r = 0; r < kRounds; ++r) {
    std::vector<double> sum(8, 0.0);
    for (size_t c = 0; c < 4; ++c) {
      const std::vector<float> x = pullers[c]->Pull(expected, kLocalSteps, kLocalLr);
      for (size_t i = 0; i < 8; ++i) sum[i] += examples[c] * (x[i] - expected[i]);
    }
    for (size_t i = 0; i < 8; ++i) expected[i] += static_cast<float>(sum[i] / 1000);
  }
  auto kept = (*parent)->aggregator().Model(kRounds);
  ASSERT_THAT(kept, IsOk());
  std::vector<float> model(8);
  ASSERT_THAT(BundleToFlat(*kept->bundle, (*parent)->aggregator().layout(), *registries.codecs,
                           absl::MakeSpan(model)),
              IsOk());
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(model[i], expected[i], 2e-2) << i;  // fp16 uplinks

  for (int e = 0; e < 2; ++e) EXPECT_THAT(uplinks[e], IsOk());
  for (const auto& s : stats) {
    ASSERT_THAT(s, IsOk());
    EXPECT_EQ(s->updates_accepted, kRounds);
  }
  // The parent heard one update an edge a round (half the flat run's four), sent in fp16; the
  // edges heard their clients' in fp32.
  const v1::ServerStatus top = (*parent)->aggregator().Status(absl::Now());
  EXPECT_EQ(top.updates_accepted(), 2u * kRounds);
  EXPECT_LT(top.payload_bytes_up() * 1.9, top.dense_bytes_up());
  for (auto& edge : edges) {
    const v1::ServerStatus st = edge->aggregator().Status(absl::Now());
    EXPECT_TRUE(st.done());
    EXPECT_EQ(st.updates_accepted(), 2u * kRounds);
    EXPECT_EQ(st.payload_bytes_up(), st.dense_bytes_up());
    EXPECT_EQ(st.parent_updates(), static_cast<uint64_t>(kRounds));
    EXPECT_EQ(st.parent_round(), static_cast<uint64_t>(kRounds));
    EXPECT_GT(st.parent_bytes_up(), 0u);
    EXPECT_GT(st.parent_bytes_down(), 0u);
  }
  for (auto& edge : edges) edge->Shutdown(absl::Seconds(1));
  (*parent)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace tern
