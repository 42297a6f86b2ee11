// In-process runs of `tern server`'s service with the built-in client (clients/cpp/fed_client.h) on
// threads: the gRPC path, the client's local work and the aggregator's rounds together.
#include "clients/cpp/fed_client.h"

#include <atomic>
#include <thread>
#include <vector>

#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "server/service.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

struct RunResult {
  std::vector<float> model;
  std::vector<FedClientStats> stats;
  int64_t updates = 0;
};

// `clients` built-in clients (softmax on the local data, iid) in local-sgd mode for `rounds`
// rounds of 5 local steps; returns the server's final model.
RunResult LocalSgdRun(int clients, int rounds, float anchor_pull, double server_lr) {
  RunResult result;
  const ServerRegistries registries = NewBuiltinServerRegistries();
  const CodecRegistry* codecs = registries.codecs.get();
  ServerOptions so;
  AggregatorOptions& a = so.aggregator;
  a.run_id = "overlap";
  a.mode = "local-sgd";
  a.min_clients = clients;
  a.total_rounds = rounds;
  a.server_lr = server_lr;
  a.policy.deadline = absl::Seconds(60);
  v1::LocalTraining* l = a.task.mutable_local();
  l->set_local_epochs(0);
  l->set_local_steps(5);
  l->set_batch(16);
  l->set_lr(0.05f);
  l->set_anchor_pull(anchor_pull);
  a.task.set_update_codec("none");
  a.task.set_seed(3);
  auto server = AggregatorServer::Start(so, &registries);
  EXPECT_THAT(server, IsOk());
  if (!server.ok()) return result;
  auto data = LoadFedClientData("", "iid", clients, "softmax", 3);
  EXPECT_THAT(data, IsOk());
  if (!data.ok()) return result;
  auto channel = MakeChannel(absl::StrCat("127.0.0.1:", (*server)->port()));
  std::atomic<bool> stop{false};
  result.stats.resize(clients);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      FedClientOptions o;
      o.run_id = "overlap";
      o.index = c;
      o.seed = 3;
      o.fetch_wait = absl::Milliseconds(200);
      auto s = RunFederatedClient(channel, o, **data, stop);
      EXPECT_THAT(s, IsOk());
      if (s.ok()) result.stats[c] = *s;
    });
  }
  (*server)->WaitDone();
  for (std::thread& t : threads) t.join();
  auto kept = (*server)->aggregator().Model(rounds);
  EXPECT_THAT(kept, IsOk());
  if (kept.ok()) {
    const std::vector<ParamTensor> layout = (*server)->aggregator().layout();
    result.model.resize(LayoutNumel(layout));
    EXPECT_THAT(BundleToFlat(*kept->bundle, layout, *codecs, absl::MakeSpan(result.model)), IsOk());
    result.updates = static_cast<int64_t>(kept->status.updates_accepted());
  }
  (*server)->Shutdown(absl::Seconds(1));
  return result;
}

// With one client the anchor it pulls to is the model its next local steps start from, so
// Overlap-Local-SGD with pull alpha is exactly local SGD with an outer step of 1 - alpha: a
// check that the client pulls by alpha, pushes the pulled model's offset from the anchor and
// starts the background steps from the pulled model.
// --client_delay_s: one delay for all, or LO:HI spread evenly by partition index.
TEST(ClientDelay, IsOneDelayOrASpreadOverTheClientsByIndex) {
  EXPECT_EQ(*ClientDelay("", 3, 10), absl::ZeroDuration());
  EXPECT_EQ(*ClientDelay("1.5", 7, 10), absl::Milliseconds(1500));
  EXPECT_EQ(*ClientDelay("0.2:2", 0, 10), absl::Milliseconds(200));
  EXPECT_EQ(*ClientDelay("0.2:2", 9, 10), absl::Seconds(2));
  EXPECT_EQ(*ClientDelay("0:9", 3, 10), absl::Seconds(3));
  EXPECT_EQ(*ClientDelay("0.5:9", 0, 1), absl::Milliseconds(500));  // one client: LO
  for (const char* bad : {"x", "-1", "1:-2", "1:2:3", "4000", ":", "1:"}) {
    EXPECT_THAT(ClientDelay(bad, 0, 10), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  ::testing::HasSubstr("--client_delay_s")))
        << bad;
  }
}

TEST(OverlapLocalSgd, OneClientEqualsLocalSgdWithOuterStepOneMinusAlpha) {
  const RunResult overlap = LocalSgdRun(1, 4, 0.25f, 1.0);
  const RunResult plain = LocalSgdRun(1, 4, 0.0f, 0.75);
  ASSERT_FALSE(overlap.model.empty());
  ASSERT_EQ(overlap.model.size(), plain.model.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < plain.model.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(overlap.model[i]) - plain.model[i]));
    norm = std::max(norm, std::abs(static_cast<double>(plain.model[i])));
  }
  EXPECT_LT(diff, 1e-5 * std::max(1.0, norm));
  EXPECT_EQ(overlap.stats[0].rounds_trained, 4);
}

// With several clients each keeps its own model: the anchor is the mean of the pulled models,
// which differs from local SGD's mean of models that all started at the anchor.
TEST(OverlapLocalSgd, ClientsKeepTheirOwnModelsAndEveryRoundTakesEveryUpdate) {
  const RunResult overlap = LocalSgdRun(3, 4, 0.5f, 1.0);
  const RunResult plain = LocalSgdRun(3, 4, 0.0f, 0.5);
  ASSERT_FALSE(overlap.model.empty());
  ASSERT_EQ(overlap.model.size(), plain.model.size());
  for (const FedClientStats& s : overlap.stats) {
    EXPECT_EQ(s.rounds_trained, 4);
    EXPECT_EQ(s.updates_accepted, 4);
  }
  double diff = 0;
  for (size_t i = 0; i < plain.model.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(overlap.model[i]) - plain.model[i]));
  }
  EXPECT_GT(diff, 1e-4);
}

}  // namespace
}  // namespace tern
