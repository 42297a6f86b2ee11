// What a worker tells health probes and Prometheus about itself.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/rpc/channel.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/http_get.h"
#include "tests/testing/status_matchers.h"
#include "worker/daemon.h"

namespace tern {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::tern::testing::IsOk;
using ::testing::HasSubstr;

DaemonOptions OneOfTwo() {
  DaemonOptions o;
  o.engine.num_workers = 2;
  o.engine.algorithm = "dpsgd";
  o.metrics_listen = "127.0.0.1:0";
  return o;
}

HealthCheckResponse::ServingStatus Health(int port, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", port)));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse r;
  const grpc::Status s = stub->Check(&ctx, req, &r);
  EXPECT_TRUE(s.ok()) << service << ": " << s.error_message();
  return r.status();
}

TEST(WorkerPeers, PeerNamesWithoutAnyCredentialToCheckAreRefusedAtStart) {
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  DaemonOptions o = OneOfTwo();
  o.peer_names = {"worker-*"};
  absl::Status s = WorkerDaemon::Start(o, &registries).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("--peer_names needs --tls_ca or --tokens"), absl::string_view::npos);
}

TEST(WorkerHealth, NotServingUntilItCanTrainWhileItsTrainerServiceTakesARegistration) {
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  auto d = WorkerDaemon::Start(OneOfTwo(), &registries);
  ASSERT_THAT(d.status(), IsOk());
  const int port = (*d)->port();
  EXPECT_EQ(Health(port, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(port, "tern.v1.Gossip"), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Health(port, "tern.v1.Trainer"), HealthCheckResponse::SERVING);

  ASSERT_THAT((*d)->trainer().Register({{"w", {4}, 0, 4}}, std::vector<float>(4, 1.f)).status(),
              IsOk());
  // Registered, but its peers are not known yet: it cannot step.
  EXPECT_EQ(Health(port, ""), HealthCheckResponse::NOT_SERVING);
  ASSERT_THAT((*d)->SetPeers({"127.0.0.1:1", "127.0.0.1:2"}), IsOk());
  EXPECT_EQ(Health(port, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(port, "tern.v1.Gossip"), HealthCheckResponse::SERVING);

  absl::StatusOr<std::string> metrics = testing::HttpGet((*d)->metrics_port(), "/metrics");
  ASSERT_THAT(metrics.status(), IsOk());
  EXPECT_THAT(*metrics, HasSubstr("tern_worker_ready{run=\"tern\",worker=\"0\"} 1"));

  (*d)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace tern
