#include "cli/report.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/json_lines.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TempDir(const std::string& name) {
  std::string base = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
                     "/tern-report-XXXXXX";
  const std::string dir = mkdtemp(base.data());
  const std::string run = dir + "/" + name;
  EXPECT_EQ(mkdir(run.c_str(), 0755), 0);
  return run;
}

void WriteRun(const std::string& dir, const v1::RunConfig& c,
              const std::vector<v1::MetricsRow>& rows, const std::string& extra_line = "") {
  std::ofstream(dir + "/run.json") << ToJsonLine(c);
  std::ofstream m(dir + "/metrics.jsonl");
  for (const v1::MetricsRow& r : rows) m << ToJsonLine(r);
  m << extra_line;
}

v1::MetricsRow Row(int step, double acc) {
  v1::MetricsRow r;
  r.set_step(step);
  r.set_round(step);
  r.set_wall_s(step * 0.5);
  r.set_test_acc(acc);
  r.set_mb_sent_per_worker(step * 0.1);
  if (step > 0) r.set_train_loss(1.0 / step);
  return r;
}

TEST(RunFolder, RowsRoundTripThroughJsonAndUnknownFieldsAreIgnored) {
  const std::string dir = TempDir("gossip-a");
  v1::RunConfig c;
  c.set_mode("gossip");
  c.set_workers(4);
  v1::MetricsRow r = Row(3, 0.75);
  r.set_consensus(1e-3);
  WriteRun(dir, c, {Row(0, 0.1), r}, "{\"step\":4,\"from_a_newer_build\":7}\n");
  const absl::StatusOr<RunSeries> run = LoadRun(dir);
  ASSERT_THAT(run, IsOk());
  EXPECT_EQ(run->name, "gossip-a");  // the folder, not the config's name
  ASSERT_EQ(run->rows.size(), 3u);
  EXPECT_FALSE(run->rows[0].has_train_loss());  // never recorded before the first step
  EXPECT_EQ(run->rows[1].SerializeAsString(), r.SerializeAsString());
  EXPECT_EQ(run->rows[2].step(), 4);
  // Numbers stay numbers: the JSON has no quoted integers.
  EXPECT_THAT(ToJsonLine(r), HasSubstr("\"step\":3,"));
}

TEST(RunFolder, ABadLineIsAnErrorNamingIt) {
  const std::string dir = TempDir("broken");
  WriteRun(dir, v1::RunConfig(), {Row(0, 0.1)}, "{\"step\":\n");
  EXPECT_THAT(LoadRun(dir), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2")));
  EXPECT_THAT(LoadRun(dir + "/nowhere"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(Report, AGossipRunChartsConsensusOnALogScaleAndNoLossBeforeTheFirstStep) {
  RunSeries run;
  run.name = "dpsgd-run";
  run.config.set_mode("gossip");
  for (int s = 0; s <= 1200; s += 300) {
    v1::MetricsRow r = Row(s, 0.5 + s / 3000.0);
    r.set_consensus(std::pow(10.0, -1 - s / 400.0));
    run.rows.push_back(r);
  }
  const std::string html = RenderReport({run});
  EXPECT_THAT(html, HasSubstr("consensus distance (log)"));
  EXPECT_THAT(html, HasSubstr(">1e-4<"));  // decade ticks
  EXPECT_THAT(html, HasSubstr(">1200<"));  // the last step tick, whole
  EXPECT_THAT(html, HasSubstr("dpsgd-run"));
  EXPECT_THAT(html, Not(HasSubstr("payload MB up")));  // nothing a gossip run lacks
  // The loss chart starts at the first step: its first point is step 300's, x > the axis.
  const size_t loss = html.find("training loss vs");
  ASSERT_NE(loss, std::string::npos);
  const size_t poly = html.find("<polyline points='", loss);
  ASSERT_NE(poly, std::string::npos);
  EXPECT_NE(html.substr(poly + 18, 5), "72.0,");  // not at x = 0 (the left edge)
}

TEST(Report, ALogAxisOfOneDecadeHasTicksBetweenItsEnds) {
  RunSeries run;
  run.name = "r";
  for (int s = 1; s <= 3; ++s) {
    v1::MetricsRow r = Row(s, 0.5);
    r.set_consensus(0.0012 * s);
    run.rows.push_back(r);
  }
  const std::string html = RenderReport({run});
  EXPECT_THAT(html, HasSubstr(">1e-3<"));
  EXPECT_THAT(html, HasSubstr(">0.002<"));
  EXPECT_THAT(html, HasSubstr(">0.005<"));
}

TEST(Report, AGossipRunStacksWhereEachStepsTimeWentTrainerIoAndTheRest) {
  RunSeries run;
  run.name = "timed";
  for (int s = 0; s <= 200; s += 100) {
    v1::MetricsRow r = Row(s, 0.5);
    r.set_compute_s(s * 0.010f);  // 10 ms a step
    r.set_encode_s(s * 0.002f);
    r.set_decode_s(s * 0.001f);
    r.set_combine_s(s * 0.002f);
    r.set_transfer_s(0);
    r.set_wait_s(s * 0.005f);
    r.set_trainer_io_s(s * 0.004f);
    r.set_step_s(s * 0.030f);  // 30 ms a step: 4 ms of trainer I/O, 6 ms of other
    run.rows.push_back(r);
  }
  const std::string html = RenderReport({run});
  const size_t chart = html.find("time per step (ms), timed");
  ASSERT_NE(chart, std::string::npos);
  size_t polygons = 0;
  for (size_t at = html.find("<polygon", chart); at != std::string::npos;
       at = html.find("<polygon", at + 1)) {
    ++polygons;
  }
  // compute, encode, decode, mix, push, wait, trainer I/O, other
  EXPECT_EQ(polygons, 8u);
  EXPECT_THAT(html, HasSubstr("trainer I/O"));
  EXPECT_THAT(html, HasSubstr("</i>decode<"));
  // The stack tops out at the whole step: 30 ms, so the axis reaches 30 (ticks of 5).
  EXPECT_THAT(html.substr(chart), HasSubstr(">30<"));
  // A run without step times (an older folder, or an aggregator run) has no such chart.
  run.rows[1].clear_step_s();
  run.rows[2].clear_step_s();
  EXPECT_THAT(RenderReport({run}), Not(HasSubstr("time per step")));
}

// Accuracy against bytes on a log axis: a run that sends 246x fewer bytes than another still has
// a curve, not a line along the y axis.
TEST(Report, AccuracyAgainstBytesIsOnALogAxisOfWholeDecades) {
  RunSeries dense, compressed;
  dense.name = "dense";
  compressed.name = "compressed";
  for (int s = 1; s <= 4; ++s) {
    v1::MetricsRow r = Row(s, 0.5 + 0.1 * s);
    r.set_mb_sent_per_worker(24.6 * s);
    dense.rows.push_back(r);
    r.set_mb_sent_per_worker(0.1 * s);
    compressed.rows.push_back(r);
  }
  const std::string html = RenderReport({dense, compressed});
  EXPECT_THAT(html, HasSubstr("MB sent per worker (log)"));
  for (const char* tick : {">0.1<", ">1<", ">10<", ">100<"}) EXPECT_THAT(html, HasSubstr(tick));
  // The compressed run's first point (0.1 MB) sits at the axis's left edge, x = 72 px, and its
  // last (0.4 MB) well inside it: 0.6 of a decade of three, ~0.2 of 460 px.
  const size_t chart = html.find("test accuracy (%) vs MB sent per worker");
  ASSERT_NE(chart, std::string::npos);
  const size_t second = html.find("<polyline", html.find("<polyline", chart) + 1);
  ASSERT_NE(second, std::string::npos);
  EXPECT_EQ(html.substr(html.find("points='", second) + 8, 5), "72.0,");
}

// A report of gossip runs and aggregator runs draws steps and rounds on axes of their own.
TEST(Report, GossipStepsAndAggregatorRoundsAreNeverOneAxis) {
  RunSeries gossip, fed;
  gossip.name = "gossip";
  gossip.config.set_mode("gossip");
  fed.name = "fed";
  fed.config.set_mode("federated");
  for (int s = 0; s <= 3; ++s) {
    gossip.rows.push_back(Row(s * 100, 0.5));
    fed.rows.push_back(Row(s, 0.6));
  }
  const std::string html = RenderReport({gossip, fed});
  EXPECT_THAT(html, HasSubstr("test accuracy (%) vs step (gossip runs)"));
  EXPECT_THAT(html, HasSubstr("test accuracy (%) vs round (aggregator runs)"));
  EXPECT_THAT(html, HasSubstr("training loss vs step (gossip runs)"));
  EXPECT_THAT(html, Not(HasSubstr("step / round")));
  // Each of the two accuracy charts draws one run.
  const size_t steps = html.find("test accuracy (%) vs step (gossip runs)");
  const size_t end = html.find("</svg>", steps);
  size_t lines = 0;
  for (size_t at = html.find("<polyline", steps); at < end; at = html.find("<polyline", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u);
}

TEST(Report, AFederatedRunChartsBytesBothWaysRefusalsAndCloseTimesNotConsensus) {
  RunSeries run;
  run.name = "fedavg";
  run.config.set_mode("federated");
  for (int r = 0; r <= 5; ++r) {
    v1::MetricsRow row = Row(r, 0.6);
    row.set_payload_mb_up(r * 2.0);
    row.set_payload_mb_down(r * 3.0);
    row.set_updates_refused(r / 2);
    row.set_updates_dropped(0);
    if (r > 0) row.set_closed_s(r * 1.5);
    run.rows.push_back(row);
  }
  const std::string html = RenderReport({run});
  for (const char* chart : {"payload MB up", "payload MB down", "updates refused",
                            "late updates dropped", "round closed at"}) {
    EXPECT_THAT(html, HasSubstr(chart));
  }
  EXPECT_THAT(html, Not(HasSubstr("consensus")));
  EXPECT_THAT(html, Not(HasSubstr("staleness of the accepted updates")));  // none was stale
}

TEST(Report, AFedBuffRunChartsItsUpdatesStaleness) {
  RunSeries run;
  run.name = "fedbuff";
  run.config.set_mode("fedbuff");
  v1::MetricsRow row = Row(1, 0.6);
  for (int64_t n : {50, 30, 20}) row.add_staleness(n);
  run.rows.push_back(row);
  const std::string html = RenderReport({run});
  EXPECT_THAT(html,
              HasSubstr("staleness of the accepted updates, fedbuff (mean 0.70, 100 updates)"));
  EXPECT_THAT(html, HasSubstr("% of updates"));
}

}  // namespace
}  // namespace tern
