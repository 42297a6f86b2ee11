#include "core/ops/metrics.h"

#include <atomic>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/http_get.h"

namespace tern {
namespace {

using ::testing::HasSubstr;

TEST(MetricSet, LabelsForEveryComeFirstOnEverySampleUnlessItHasItsOwn) {
  MetricSet m;
  m.LabelEvery({{"run", "r1"}});
  m.Counter("a_total", "A.", 1);
  m.Gauge("b", "B.", 2, {{"kind", "x"}});
  m.Counter("c_total", "C.", 3, {{"run", "other"}, {"reason", "y"}});
  const std::vector<prometheus::MetricFamily> f = m.Take();
  ASSERT_EQ(f.size(), 3u);
  auto labels = [](const prometheus::MetricFamily& family) {
    std::vector<std::string> out;
    for (const prometheus::ClientMetric::Label& l : family.metric.at(0).label) {
      out.push_back(l.name + "=" + l.value);
    }
    return out;
  };
  EXPECT_THAT(labels(f[0]), ::testing::ElementsAre("run=r1"));
  EXPECT_THAT(labels(f[1]), ::testing::ElementsAre("run=r1", "kind=x"));
  EXPECT_THAT(labels(f[2]), ::testing::ElementsAre("run=other", "reason=y"));
}

// The HTTP server's worker threads have 100 KB stacks; a daemon's collect function runs on a
// thread of the ordinary size, so a deep one (as under ASan) does not overflow a scrape.
TEST(MetricsEndpoint, ACollectFunctionMayUseMoreStackThanTheHttpServersThreadsHave) {
  auto e = MetricsEndpoint::Start("127.0.0.1:0", [](MetricSet& m) {
    volatile char deep[512 << 10];  // 5x the HTTP server's whole stack
    // Every page, from the top down, as a growing stack is touched (a write far below the
    // guard page alone could land in another mapping).
    for (size_t i = sizeof(deep); i >= 4096; i -= 4096) deep[i - 1] = 1;
    deep[0] = 2;
    m.Gauge("tern_test_deep", "Deep.", deep[0] + deep[sizeof(deep) - 1]);
  });
  ASSERT_TRUE(e.ok()) << e.status();
  absl::StatusOr<std::string> body = testing::HttpGet((*e)->port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("tern_test_deep 3"));
}

TEST(MetricsEndpoint, AScrapeReadsTheDaemonsCountersAtThatMoment) {
  std::atomic<int> steps{3};
  auto e = MetricsEndpoint::Start("127.0.0.1:0", [&](MetricSet& m) {
    m.Counter("tern_test_steps_total", "Steps.", steps.load(), {{"worker", "0"}});
    m.Counter("tern_test_steps_total", "Steps.", 7, {{"worker", "1"}});
    m.Gauge("tern_test_ready", "Ready.", 1);
  });
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_GT((*e)->port(), 0);
  absl::StatusOr<std::string> body = testing::HttpGet((*e)->port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("# TYPE tern_test_steps_total counter"));
  EXPECT_THAT(*body, HasSubstr("tern_test_steps_total{worker=\"0\"} 3"));
  EXPECT_THAT(*body, HasSubstr("tern_test_steps_total{worker=\"1\"} 7"));
  EXPECT_THAT(*body, HasSubstr("# TYPE tern_test_ready gauge"));
  EXPECT_THAT(*body, HasSubstr("tern_build_info{"));
  EXPECT_THAT(*body, HasSubstr("process_start_time_seconds "));
  steps = 4;
  body = testing::HttpGet((*e)->port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("tern_test_steps_total{worker=\"0\"} 4"));
}

TEST(MetricsEndpoint, APortAlreadyTakenIsAnErrorNotACrash) {
  auto first = MetricsEndpoint::Start("127.0.0.1:0", [](MetricSet&) {});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second =
      MetricsEndpoint::Start(absl::StrCat("127.0.0.1:", (*first)->port()), [](MetricSet&) {});
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("cannot listen on"));
}

TEST(MetricsEndpoint, NoCollectRunsAfterTheEndpointIsGone) {
  std::atomic<int> calls{0};
  int port = 0;
  {
    auto e = MetricsEndpoint::Start("127.0.0.1:0", [&](MetricSet&) { ++calls; });
    ASSERT_TRUE(e.ok()) << e.status();
    port = (*e)->port();
    ASSERT_TRUE(testing::HttpGet(port, "/metrics").ok());
  }
  const int seen = calls.load();
  EXPECT_FALSE(testing::HttpGet(port, "/metrics").ok());
  EXPECT_EQ(calls.load(), seen);
}

}  // namespace
}  // namespace tern
