// Integration tests with real processes: `tern run` and `tern worker` daemons on 127.0.0.1,
// each on a port it picked itself (port 0), talking over gRPC.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/chunking.h"
#include "common/crc32.h"
#include "core/rpc/channel.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tern/v1/worker.grpc.pb.h"
#include "tests/integration/process_util.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::testing::HasSubstr;

TEST(TernRun, ShortRunOfFourWorkerProcessesConverges) {
  const std::string dir = MakeTempDir();
  pid_t pid = Spawn({"run", "--workers=4", "--epochs=1", "--batch=64", "--evals_per_epoch=1",
                     "--algorithm=dpsgd", "--codec=none", "--log_level=warn", "--out=" + dir},
                    dir + "/run.log");
  ASSERT_EQ(Wait(pid), 0) << ReadText(dir + "/run.log");
  EXPECT_EQ(Last(dir, "workers"), 4);
  EXPECT_GT(Last(dir, "test_acc"), Synthetic(dir) ? 0.5 : 0.75);
  // Dense fp32 on a ring: each worker sent its whole model to 2 neighbours each round.
  EXPECT_NEAR(Last(dir, "compression"), 1.0, 1e-6);
  EXPECT_GT(Last(dir, "mb_sent_per_worker"), 0);
  EXPECT_NE(ReadText(dir + "/report.html").find("<svg"), std::string::npos);
  // Per-step accounting: one line per step, each a ring round's worth of bytes.
  const std::string steps = ReadText(dir + "/worker-0.steps.jsonl");
  EXPECT_EQ(std::count(steps.begin(), steps.end(), '\n'), 235);
  EXPECT_NE(steps.find("\"payload_bytes_sent\":875088,"), std::string::npos);  // 2 x 109386 x 4
}

// --bucket_mb: each worker's built-in trainer hands its layers over during the backward pass and
// each bucket has its own rounds; the run converges as one without, with the same payload.
TEST(TernRun, ABucketedRunConvergesAndSendsWhatAWholeModelRunSends) {
  const std::string dir = MakeTempDir();
  pid_t pid = Spawn(
      {"run", "--workers=4", "--epochs=1", "--batch=64", "--evals_per_epoch=1", "--algorithm=dpsgd",
       "--codec=none", "--bucket_mb=0.01", "--log_level=warn", "--out=" + dir},
      dir + "/run.log");
  ASSERT_EQ(Wait(pid), 0) << ReadText(dir + "/run.log");
  EXPECT_GT(Last(dir, "test_acc"), Synthetic(dir) ? 0.5 : 0.75);
  const std::string steps = ReadText(dir + "/worker-0.steps.jsonl");
  EXPECT_EQ(std::count(steps.begin(), steps.end(), '\n'), 235);
  EXPECT_NE(steps.find("\"payload_bytes_sent\":875088,"), std::string::npos);  // two buckets
  EXPECT_NE(steps.find("\"mixed\":2,"), std::string::npos);
}

// A one-epoch run of 4 diloco workers (`tern run` with `flags` after the common ones) into `dir`,
// checked to have converged and ended with every worker on the group's model; each of worker 0's
// 235 steps' payload bytes sent (a round's bytes count when it is mixed), or none if it failed.
std::vector<int64_t> DilocoRunBytesSent(const std::string& dir,
                                        const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"run",
                                   "--workers=4",
                                   "--epochs=1",
                                   "--batch=64",
                                   "--evals_per_epoch=1",
                                   "--algorithm=diloco",
                                   "--log_level=warn",
                                   "--out=" + dir};
  args.insert(args.end(), flags.begin(), flags.end());
  const int status = Wait(Spawn(args, dir + "/run.log"));
  EXPECT_EQ(status, 0) << ReadText(dir + "/run.log");
  if (status != 0) return {};
  EXPECT_GT(Last(dir, "test_acc"), Synthetic(dir) ? 0.5 : 0.75);
  EXPECT_EQ(Last(dir, "consensus"), 0.0);  // every worker holds the outer model
  const std::string steps = ReadText(dir + "/worker-0.steps.jsonl");
  std::vector<int64_t> sent;
  for (absl::string_view line : absl::StrSplit(steps, '\n', absl::SkipEmpty())) {
    const absl::string_view key = "\"payload_bytes_sent\":";
    const size_t at = line.find(key);
    EXPECT_NE(at, absl::string_view::npos) << line;
    if (at == absl::string_view::npos) return {};
    sent.push_back(std::atoll(std::string(line.substr(at + key.size())).c_str()));
  }
  EXPECT_EQ(sent.size(), 235u) << steps.substr(0, 2000);
  return sent;
}

// --algorithm=diloco with --fragments=2 (the complete graph its default): the outer step among
// the workers, in 4-bit updates, converges; each fragment is exchanged once per H = 10 steps, at
// its own step (the back one 5 steps before the front one), each exchange carrying one fragment,
// and both at the run's last step, which ends on the group's model.
TEST(TernRun, DilocoInTwoFragmentsConvergesAndExchangesOneFragmentAtATime) {
  const std::string dir = MakeTempDir();
  const std::vector<int64_t> sent = DilocoRunBytesSent(
      dir, {"--local_steps=10", "--codec=fp4", "--fragments=2", "--model=mlp:hidden=32x256x256"});
  ASSERT_EQ(sent.size(), 235u);
  EXPECT_GT(Last(dir, "compression"), 7.0);        // 4.25 bits a value
  std::map<int, std::set<int64_t>> sent_by_phase;  // step mod 10 -> payload bytes sent
  for (size_t t = 0; t + 1 < sent.size(); ++t) {
    if (sent[t] > 0) sent_by_phase[static_cast<int>(t % 10)].insert(sent[t]);
  }
  ASSERT_EQ(sent_by_phase.size(), 2u);
  EXPECT_EQ(sent_by_phase.begin()->first, 4);   // the back fragment, early
  EXPECT_EQ(sent_by_phase.rbegin()->first, 9);  // the front one, every 10th step
  ASSERT_EQ(sent_by_phase[4].size(), 1u);
  ASSERT_EQ(sent_by_phase[9].size(), 1u);
  const int64_t back = *sent_by_phase[4].begin(), front = *sent_by_phase[9].begin();
  EXPECT_NE(back, front);
  EXPECT_EQ(sent.back(), back + front);  // step 234: both
  EXPECT_NE(ReadText(dir + "/run.json").find("nesterov"), std::string::npos);
}

// --fragments_min with H's range, as a user gives them to `tern run`: however the link's
// measurements move the count (one turn or two), every exchange carries whole fragments (one, or
// both at once), the run converges and ends on the group's model, and the run's config says the
// range.
TEST(TernRun, DilocoWithAFragmentCountRangeExchangesWholeFragmentsAndConverges) {
  const std::string dir = MakeTempDir();
  const std::vector<int64_t> sent = DilocoRunBytesSent(
      dir, {"--local_steps=10", "--local_steps_min=2", "--local_steps_max=40", "--codec=fp4",
            "--fragments=2", "--fragments_min=1", "--model=mlp:hidden=32x256x256"});
  ASSERT_EQ(sent.size(), 235u);
  const int64_t both = sent.back();  // the run's last step exchanges every fragment
  std::set<int64_t> sizes;
  for (int64_t b : sent) {
    if (b > 0) sizes.insert(b);
  }
  for (int64_t b : sizes) {
    EXPECT_TRUE(b == both || sizes.count(both - b) == 1) << b << " of " << both;
  }
  EXPECT_LE(sizes.size(), 3u);
  const std::string config = ReadText(dir + "/run.json");
  EXPECT_THAT(config, HasSubstr("\"fragments_min\":1"));
  EXPECT_THAT(config, HasSubstr("\"local_steps_max\":40"));
}

// --fragment_cut=strided: the MLP's layers (fc1 … fc4, no numbered blocks) dealt out in turn,
// fc1 and fc3 in one fragment, fc2 and fc4 in the other, each exchanged at its own step as
// contiguous fragments are; the run converges and ends on the group's model.
TEST(TernRun, DilocoInStridedFragmentsExchangesEveryOtherLayerTogether) {
  const std::string dir = MakeTempDir();
  const std::vector<int64_t> sent =
      DilocoRunBytesSent(dir, {"--local_steps=10", "--codec=none", "--fragments=2",
                               "--fragment_cut=strided", "--model=mlp:hidden=32x256x256"});
  ASSERT_EQ(sent.size(), 235u);
  std::map<int64_t, std::set<int>> phases_by_bytes;  // payload bytes sent -> steps mod 10
  for (size_t t = 0; t + 1 < sent.size(); ++t) {
    if (sent[t] > 0) phases_by_bytes[sent[t]].insert(static_cast<int>(t % 10));
  }
  // fp32 to three others: fc2 + fc4 (32·256 + 256 + 256·10 + 10 values) at step 4 of each
  // period, fc1 + fc3 (784·32 + 32 + 256·256 + 256) at step 9, both at the last step.
  constexpr int64_t kBack = 3 * 4 * (32 * 256 + 256 + 256 * 10 + 10);
  constexpr int64_t kFront = 3 * 4 * (784 * 32 + 32 + 256 * 256 + 256);
  EXPECT_THAT(phases_by_bytes, ::testing::ElementsAre(::testing::Pair(kBack, std::set<int>{4}),
                                                      ::testing::Pair(kFront, std::set<int>{9})));
  EXPECT_EQ(sent.back(), kBack + kFront);
  const std::string config = ReadText(dir + "/run.json");
  EXPECT_THAT(config, HasSubstr("\"fragments\":2"));
  EXPECT_THAT(config, HasSubstr("\"fragment_cut\":\"strided\""));
}

// --outer_delay=eager through `tern run`: each exchange (pushed at steps 9, 19, …) is mixed at
// the next one, ten steps later (a round's bytes count when it is mixed), both the last two at
// the run's last step; the run converges and ends with every worker on the group's model.
TEST(TernRun, DilocoWithEagerOuterStepsConvergesAndEndsOnOneModel) {
  const std::string dir = MakeTempDir();
  const std::vector<int64_t> sent = DilocoRunBytesSent(
      dir,
      {"--local_steps=10", "--codec=fp4", "--outer=average", "--overlap", "--outer_delay=eager"});
  ASSERT_EQ(sent.size(), 235u);
  std::vector<int64_t> mixed_at;
  for (size_t t = 0; t < sent.size(); ++t) {
    if (sent[t] > 0) mixed_at.push_back(static_cast<int64_t>(t));
  }
  ASSERT_EQ(mixed_at.size(), 23u);
  EXPECT_EQ(mixed_at.front(), 19);
  for (size_t k = 0; k + 1 < mixed_at.size(); ++k) EXPECT_EQ(mixed_at[k], 19 + 10 * k);
  EXPECT_EQ(mixed_at.back(), 234);
}

TEST(TernRun, KillingOneWorkerMidRunLetsTheRestFinish) {
  const std::string dir = MakeTempDir();
  pid_t pid = Spawn(
      {"run", "--workers=4", "--epochs=1", "--batch=64", "--evals_per_epoch=1", "--algorithm=dpsgd",
       "--round_timeout=5", "--kill_worker=2@60", "--log_level=warn", "--out=" + dir},
      dir + "/run.log");
  ASSERT_EQ(Wait(pid), 0) << ReadText(dir + "/run.log");
  const std::string log = ReadText(dir + "/run.log");
  EXPECT_NE(log.find("killed worker 2"), std::string::npos) << log;
  // The run says which child died and the line of its log that tells why (here, its last).
  EXPECT_NE(log.find("worker 2 exited (signal 9): "), std::string::npos) << log;
  EXPECT_EQ(Last(dir, "workers"), 3);
  EXPECT_GT(Last(dir, "test_acc"), Synthetic(dir) ? 0.5 : 0.7);
  // Worker 2's neighbours (1 and 3) noticed: their push failed, or its message never came.
  for (int i : {1, 3}) {
    const std::string log_i = ReadText(absl::StrCat(dir, "/worker-", i, ".log"));
    EXPECT_TRUE(log_i.find("push to 2 failed") != std::string::npos ||
                log_i.find("no message from 2") != std::string::npos)
        << log_i;
  }
}

// diloco with a worker SIGKILLed between exchanges (H = 20: after the one at step 59, before the
// one at 79): the other three notice at the next exchange (its pushes refused), average the three
// updates they heard, and finish the run on one model.
TEST(TernRun, DilocoSurvivorsOfAKilledWorkerFinishOnOneModel) {
  const std::string dir = MakeTempDir();
  pid_t pid = Spawn({"run", "--workers=4", "--epochs=1", "--batch=64", "--evals_per_epoch=1",
                     "--algorithm=diloco", "--local_steps=20", "--codec=fp4", "--round_timeout=5",
                     "--kill_worker=2@65", "--log_level=warn", "--out=" + dir},
                    dir + "/run.log");
  ASSERT_EQ(Wait(pid), 0) << ReadText(dir + "/run.log");
  const std::string log = ReadText(dir + "/run.log");
  EXPECT_NE(log.find("killed worker 2"), std::string::npos) << log;
  EXPECT_EQ(Last(dir, "workers"), 3);
  EXPECT_GT(Last(dir, "test_acc"), Synthetic(dir) ? 0.5 : 0.7);
  EXPECT_EQ(Last(dir, "consensus"), 0.0);
}

// diloco with a worker SIGKILLed mid-run and started again with the same command (as systemd
// restarts one, on the same port): it takes the group's state from a live peer, sits the
// exchanges out until its peers wait for it, and the four end the run on one model, byte for
// byte.
TEST(TernWorker, ARestartedDilocoWorkerRejoinsAndTheRunEndsOnOneModel) {
  const std::string dir = MakeTempDir();
  constexpr int kWorkers = 4;
  const auto args = [&](int i, const std::string& listen, const std::string& tag) {
    std::vector<std::string> a = {"worker",
                                  absl::StrCat("--id=", i),
                                  absl::StrCat("--workers=", kWorkers),
                                  "--listen=" + listen,
                                  absl::StrCat("--port_file=", dir, "/", i, ".port"),
                                  "--peers_file=" + dir + "/peers.txt"};
    for (std::string& f : DilocoTrainingArgs(2400, absl::StrCat(dir, "/", i, tag, ".steps.jsonl"),
                                             absl::StrCat(dir, "/final-", i, ".bin"))) {
      a.push_back(std::move(f));
    }
    return a;
  };
  std::vector<pid_t> pids;
  for (int i = 0; i < kWorkers; ++i) {
    pids.push_back(Spawn(args(i, "127.0.0.1:0", ""), absl::StrCat(dir, "/", i, ".log")));
  }
  std::string peers;
  std::vector<int> ports;
  for (int i = 0; i < kWorkers; ++i) {
    ports.push_back(WaitForPort(absl::StrCat(dir, "/", i, ".port")));
    ASSERT_GT(ports.back(), 0) << "worker " << i << " did not start";
    absl::StrAppend(&peers, "127.0.0.1:", ports.back(), "\n");
  }
  WriteText(dir + "/peers.tmp", peers);
  std::rename((dir + "/peers.tmp").c_str(), (dir + "/peers.txt").c_str());
  // Worker 2 killed after 240 of its steps, between two exchanges or in one.
  for (int t = 0; t < 12000 && Lines(dir + "/2.steps.jsonl").size() < 240; ++t) {
    usleep(10 * 1000);
  }
  if (Lines(dir + "/2.steps.jsonl").size() < 240) {
    for (pid_t p : pids) kill(p, SIGKILL);
    FAIL() << "worker 2 did not get to step 240: " << ReadText(dir + "/2.log");
  }
  kill(pids[2], SIGKILL);
  EXPECT_EQ(Wait(pids[2]), 128 + SIGKILL);
  pids[2] = Spawn(args(2, absl::StrCat("127.0.0.1:", ports[2]), "-again"), dir + "/2-again.log");
  for (int i = 0; i < kWorkers; ++i) {
    EXPECT_EQ(Wait(pids[i]), 0) << ReadText(absl::StrCat(dir, "/", i, ".log"));
  }
  const std::string again = ReadText(dir + "/2-again.log");
  EXPECT_THAT(again, HasSubstr("rejoined at step")) << again;
  EXPECT_THAT(ReadText(dir + "/0.log"), HasSubstr("worker 2 is back"));
  const std::string model = ReadText(dir + "/final-0.bin");
  EXPECT_GT(model.size(), 100000u);
  for (int i = 1; i < kWorkers; ++i) {
    EXPECT_TRUE(ReadText(absl::StrCat(dir, "/final-", i, ".bin")) == model) << "worker " << i;
  }
}

// A quarter of the workers SIGKILLed at once: with the scheduler the survivors are re-linked
// into one ring (static, it would split in two halves that drift apart: consensus ~3), and the
// two halves of the split, which ran apart while the failures were being noticed, catch up with
// each other rather than wait a round deadline every round.
TEST(TernRun, AQuarterOfTheWorkersKilledWithTheSchedulerLeavesOneRingInConsensus) {
  const std::string dir = MakeTempDir();
  // Long enough in rounds for a fast machine to run past the repair. While the deaths go
  // unnoticed (1.5 s), workers 3 and 4, between the two dead ones, mix only with each other and
  // run free (they do not wait for the dead); the new graph applies past the furthest of them,
  // plus two heartbeats of its rate (server/membership.h). Seen here: the switch at round 1438,
  // the pair at ~900 rounds a second; a CI machine ran its 6-epoch run (1410 rounds) to the end
  // before the switch. 24 epochs (5640 rounds) leave room for a pair at 3000 rounds a second;
  // the ring then needs ~100 rounds to agree again.
  pid_t pid =
      Spawn({"run", "--workers=8", "--epochs=24", "--evals_per_epoch=1", "--scheduler=local",
             "--round_timeout=5", "--kill_worker=2@60,5@60", "--log_level=warn", "--out=" + dir},
            dir + "/run.log");
  ASSERT_EQ(Wait(pid), 0) << ReadText(dir + "/run.log");
  const std::string scheduler = ReadText(dir + "/scheduler.log");
  EXPECT_NE(scheduler.find("worker 2 ('worker-2') silent"), std::string::npos) << scheduler;
  EXPECT_NE(scheduler.find("worker 5 ('worker-5') silent"), std::string::npos) << scheduler;
  EXPECT_EQ(Last(dir, "workers"), 6);
  EXPECT_LT(Last(dir, "consensus"), 0.1) << ReadText(dir + "/metrics.jsonl");
  EXPECT_GT(Last(dir, "test_acc"), Synthetic(dir) ? 0.5 : 0.75);
  // Worker 1 ends up mixing with 0 and 3 (2 is gone): the repaired ring.
  const std::string steps = ReadText(dir + "/worker-1.steps.jsonl");
  EXPECT_NE(steps.find("\"mixed_ids\":[0,3]"), std::string::npos);
}

// The same two kills without the scheduler split the static ring in two halves that drift apart:
// the run trains on, but it is not done, and its last line says why.
TEST(TernRun, ARingSplitByTwoKillsWithoutTheSchedulerIsAFailedRunSayingWhy) {
  const std::string dir = MakeTempDir();
  pid_t pid = Spawn({"run", "--workers=8", "--epochs=3", "--evals_per_epoch=1", "--round_timeout=5",
                     "--kill_worker=2@60,5@60", "--log_level=warn", "--out=" + dir},
                    dir + "/run.log");
  EXPECT_EQ(Wait(pid), 1) << ReadText(dir + "/run.log");
  const std::string log = ReadText(dir + "/run.log");
  const std::string last = log.substr(log.rfind("run failed"));
  EXPECT_THAT(last, HasSubstr("the workers' models disagree more and more")) << log;
  EXPECT_GT(Last(dir, "consensus"), 0.5);
}

size_t MetricLines(const std::string& dir) {
  std::ifstream f(dir + "/metrics.jsonl");
  size_t n = 0;
  std::string line;
  while (std::getline(f, line)) n += !line.empty();
  return n;
}

TEST(TernRun, CtrlCStopsEveryWorkerAndKeepsWhatWasMeasured) {
  const std::string dir = MakeTempDir();
  pid_t pid = Spawn({"run", "--workers=4", "--epochs=3", "--batch=64", "--evals_per_epoch=4",
                     "--algorithm=dpsgd", "--out=" + dir},
                    dir + "/run.log", /*own_group=*/true);
  // Wait for two evaluations, then Ctrl-C the whole job (launcher and workers).
  for (int tries = 0; tries < 1200 && MetricLines(dir) < 2; ++tries) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GE(MetricLines(dir), 2u) << ReadText(dir + "/run.log");
  ASSERT_EQ(kill(-pid, SIGINT), 0);
  EXPECT_EQ(Wait(pid), 130) << ReadText(dir + "/run.log");
  EXPECT_NE(ReadText(dir + "/run.log").find("interrupted"), std::string::npos);
  EXPECT_NE(ReadText(dir + "/report.html").find("<svg"), std::string::npos);
  // Nobody is left running in the job's process group.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(kill(-pid, 0), -1);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NE(ReadText(absl::StrCat(dir, "/worker-", i, ".log")).find("shutting down"),
              std::string::npos)
        << "worker " << i;
  }
}

class FourDaemons : public ::testing::Test {
 protected:
  static constexpr absl::Duration kCallDeadline = absl::Seconds(30);

  void SetUp() override {
    dir_ = MakeTempDir();
    for (int i = 0; i < 4; ++i) {
      pids_.push_back(
          Spawn({"worker", absl::StrCat("--id=", i), "--workers=4", "--algorithm=dpsgd",
                 "--epochs=1", "--batch=64", absl::StrCat("--port_file=", dir_, "/", i, ".port"),
                 absl::StrCat("--peers_file=", dir_, "/peers.txt")},
                absl::StrCat(dir_, "/worker-", i, ".log")));
    }
    std::string peers;
    for (int i = 0; i < 4; ++i) {
      int port = 0;
      for (int tries = 0; tries < 600 && port == 0; ++tries) {
        std::ifstream(absl::StrCat(dir_, "/", i, ".port")) >> port;
        if (port == 0) absl::SleepFor(absl::Milliseconds(50));
      }
      ASSERT_GT(port, 0) << "worker " << i << " did not start";
      addresses_.push_back(absl::StrCat("127.0.0.1:", port));
      absl::StrAppend(&peers, addresses_.back(), "\n");
    }
    std::ofstream(dir_ + "/peers.tmp") << peers;
    std::rename((dir_ + "/peers.tmp").c_str(), (dir_ + "/peers.txt").c_str());
  }
  void TearDown() override {
    for (pid_t p : pids_) kill(p, SIGTERM);
    for (pid_t p : pids_) EXPECT_EQ(Wait(p), 0);
  }

  v1::WorkerStats Stats(int i) {
    auto stub = v1::Trainer::NewStub(MakeChannel(addresses_[i]));
    grpc::ClientContext ctx;
    // Generous: under ASan, with other tests' daemons on the same 2 cores, a call can wait.
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    v1::WorkerStats s;
    const grpc::Status status = stub->Stats(&ctx, v1::StatsRequest(), &s);
    EXPECT_TRUE(status.ok()) << "Stats of worker " << i << ": " << status.error_code() << " "
                             << status.error_message();
    return s;
  }

  // Waits (up to 30 s) until worker i has done at least `n` steps; its stats then.
  v1::WorkerStats WaitForSteps(int i, uint64_t n) {
    for (int tries = 0; tries < 600 && Stats(i).steps() < n; ++tries) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    return Stats(i);
  }

  // Pushes `chunks` to worker `i` as a rogue peer; returns the status the worker answered.
  grpc::Status Push(int i, const std::vector<v1::BundleChunk>& chunks) {
    auto stub = v1::Gossip::NewStub(MakeChannel(addresses_[i]));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    v1::PushReply reply;
    auto w = stub->Push(&ctx, &reply);
    for (const auto& c : chunks) {
      if (!w->Write(c)) break;
    }
    w->WritesDone();
    return w->Finish();
  }

  static std::vector<v1::BundleChunk> Chunks(const v1::TensorBundle& b) {
    return *ChunkBundle(b, 7, 256);  // small chunks, so there are several
  }

  std::string dir_;
  std::vector<pid_t> pids_;
  std::vector<std::string> addresses_;
};

TEST_F(FourDaemons, MalformedAndWrongRoundMessagesAreRefusedAndRoundsContinue) {
  // Let training get going.
  const uint64_t at = WaitForSteps(0, 5).steps();
  ASSERT_GE(at, 5u);

  v1::TensorBundle b;
  b.set_run_id("tern");
  b.set_sender("1");  // a genuine neighbour of worker 0 on the ring
  v1::NamedTensor* t = b.add_tensors();
  t->set_name("x");
  t->mutable_tensor()->set_codec("none.v1");
  t->mutable_tensor()->set_numel(109386);
  t->mutable_tensor()->set_payload(std::string(4000, 'z'));  // far too short for the model

  // A closed round.
  b.set_round(0);
  grpc::Status s = Push(0, Chunks(b));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  // A round still open, but a payload that does not decode.
  b.set_round(at + 25);
  s = Push(0, Chunks(b));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // Another run.
  b.set_run_id("someone-else");
  s = Push(0, Chunks(b));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // Corrupted bytes in transit.
  std::vector<v1::BundleChunk> chunks = Chunks(b);
  (*chunks[1].mutable_data())[3] ^= 0x40;
  s = Push(0, chunks);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  // A stream cut short.
  chunks = Chunks(b);
  chunks.resize(2);
  s = Push(0, chunks);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // Garbage that is not even a chunk sequence start.
  v1::BundleChunk junk;
  junk.set_offset(12345);
  s = Push(0, {junk});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();

  // The rounds go on, on the attacked worker and its neighbours, with nobody dropped.
  const uint64_t after = Stats(0).steps();
  v1::WorkerStats s0 = WaitForSteps(0, after + 20);
  EXPECT_GE(s0.steps(), after + 20);
  EXPECT_EQ(s0.messages_refused(), 6u);
  EXPECT_EQ(s0.neighbours_dropped(), 0u);
  EXPECT_GE(Stats(1).steps(), after + 10);
}

// Well-formed but harmful: each is refused with INVALID_ARGUMENT before it changes anything, and
// the attacked worker trains on with a finite loss.
TEST_F(FourDaemons, NanInfMisshapenAndBlownUpMessagesAreRefusedAndTrainingGoesOn) {
  const uint64_t at = WaitForSteps(0, 5).steps();
  ASSERT_GE(at, 5u);
  constexpr uint64_t kNumel = 109386;  // the default mlp:hidden=128x64
  auto message = [&](std::vector<float> x) {
    v1::TensorBundle b;
    b.set_run_id("tern");
    b.set_sender("1");
    // A round still open when it arrives, however far the worker got meanwhile.
    b.set_round(Stats(0).steps() + 20);
    v1::NamedTensor* t = b.add_tensors();
    t->set_name("x");
    t->mutable_tensor()->set_codec("none.v1");
    t->mutable_tensor()->set_numel(kNumel);
    t->mutable_tensor()->set_payload(x.data(), 4 * x.size());
    return b;
  };
  std::vector<float> x(kNumel, 0.01f);
  x[17] = std::nanf("");
  grpc::Status s = Push(0, Chunks(message(x)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  x[17] = std::numeric_limits<float>::infinity();
  s = Push(0, Chunks(message(x)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  x[17] = 0.01f;
  v1::TensorBundle misshapen = message(x);
  misshapen.mutable_tensors(0)->mutable_tensor()->add_shape(3);
  misshapen.mutable_tensors(0)->mutable_tensor()->add_shape(5);
  s = Push(0, Chunks(misshapen));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("shape"));
  s = Push(0, Chunks(message(std::vector<float>(kNumel, 1e30f))));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("norm_guard"));
  // A sparse message with one NaN value.
  v1::TensorBundle sparse = message({});
  v1::EncodedTensor* t = sparse.mutable_tensors(0)->mutable_tensor();
  t->set_codec("topk.v1");
  const uint32_t k = 1, index = 5;
  const float nan = std::nanf("");
  std::string payload(12, '\0');
  std::memcpy(payload.data(), &k, 4);
  std::memcpy(payload.data() + 4, &index, 4);
  std::memcpy(payload.data() + 8, &nan, 4);
  t->set_payload(payload);
  s = Push(0, Chunks(sparse));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();

  const uint64_t after = Stats(0).steps();
  v1::WorkerStats s0 = WaitForSteps(0, after + 20);
  EXPECT_GE(s0.steps(), after + 20);
  EXPECT_EQ(s0.messages_refused(), 5u);
  EXPECT_TRUE(std::isfinite(s0.loss_sum())) << s0.loss_sum();
}

// A message the norm guard lets through (its norm is about the model's) that is nowhere near the
// model (every value 0.05): clipped around worker 0's own model, so it moves it by no more than
// a neighbour's usual pull, and training goes on (docs/robustness.md, "clipped gossip").
TEST_F(FourDaemons, AMessageUnderTheGuardButFarFromTheModelIsClippedAndTrainingGoesOn) {
  const uint64_t at = WaitForSteps(0, 5).steps();
  ASSERT_GE(at, 5u);
  constexpr uint64_t kNumel = 109386;  // the default mlp:hidden=128x64
  const std::vector<float> x(kNumel, 0.05f);
  v1::TensorBundle b;
  b.set_run_id("tern");
  b.set_sender("1");
  const uint64_t round = Stats(0).steps() + 20;
  b.set_round(round);
  v1::NamedTensor* t = b.add_tensors();
  t->set_name("x");
  t->mutable_tensor()->set_codec("none.v1");
  t->mutable_tensor()->set_numel(kNumel);
  t->mutable_tensor()->set_payload(x.data(), 4 * x.size());
  const grpc::Status s = Push(0, Chunks(b));
  ASSERT_TRUE(s.ok()) << s.error_message();
  const v1::WorkerStats s0 = WaitForSteps(0, round + 5);
  EXPECT_GE(s0.steps(), round + 5);
  EXPECT_GE(s0.contributions_clipped(), 1u);
  EXPECT_TRUE(std::isfinite(s0.loss_sum())) << s0.loss_sum();
}

// Stalled Gossip.Push streams, each parked after one 1 MiB chunk of a 64 MiB message: past the
// 16 MiB budget they are refused with RESOURCE_EXHAUSTED, the worker's memory stays within the
// budget plus a constant, and the parked ones are cancelled once idle.
TEST(StalledStreams, AWorkerRefusesThemPastItsBudgetAndCancelsThemWhenIdle) {
  const std::string dir = MakeTempDir();
  const pid_t pid =
      Spawn({"worker", "--id=0", "--workers=2", "--port_file=" + dir + "/port",
             "--peers=127.0.0.1:1,127.0.0.1:2", "--trainer=external", "--max_buffered_mb=16",
             "--max_streams=1000", "--max_streams_per_peer=1000", "--stream_idle_s=3"},
            dir + "/worker.log");
  const int port = WaitForPort(dir + "/port");
  ASSERT_GT(port, 0) << ReadText(dir + "/worker.log");
  auto stub = v1::Gossip::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", port)));
  const double rss0 = RssMb(pid);
  v1::BundleChunk chunk;
  chunk.set_total_size(uint64_t{64} << 20);
  chunk.set_data(std::string(size_t{1} << 20, 'x'));
  chunk.set_data_crc32(Crc32(chunk.data().data(), chunk.data().size()));
  constexpr int kStreams = 40;
  std::vector<std::unique_ptr<grpc::ClientContext>> ctx;
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::BundleChunk>>> writers;
  std::vector<v1::PushReply> replies(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    ctx.push_back(std::make_unique<grpc::ClientContext>());
    ctx.back()->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    writers.push_back(stub->Push(ctx.back().get(), &replies[i]));
    chunk.set_stream_id(static_cast<uint64_t>(i));
    writers.back()->Write(chunk);
  }
  absl::SleepFor(absl::Seconds(1));
  const double rss1 = RssMb(pid);
  std::printf("worker RSS %.1f -> %.1f MiB with %d stalled streams\n", rss0, rss1, kStreams);
  // 16 MiB held, plus gRPC's buffers for 40 streams and allocator slack.
  if (!kSanitized) {
    EXPECT_LT(rss1 - rss0, 16 + 48) << rss0 << " -> " << rss1 << " MiB";
  }
  absl::SleepFor(absl::Seconds(4));  // idle 3 s, swept every second
  std::vector<grpc::Status> statuses;
  for (int i = 0; i < kStreams; ++i) {
    writers[i]->WritesDone();
    statuses.push_back(writers[i]->Finish());
  }
  std::map<int, int> n = CountCodes(statuses);
  // 16 parked within the budget, then cancelled when idle; the rest refused. A stream whose first
  // chunk is read only after the sweep has freed the budget is parked and cancelled in its turn
  // (one budget more at most), so the split is exact only when every first chunk is read within
  // the idle timeout.
  EXPECT_EQ(n[grpc::StatusCode::RESOURCE_EXHAUSTED] + n[grpc::StatusCode::CANCELLED], kStreams);
  EXPECT_GE(n[grpc::StatusCode::CANCELLED], 16);
  EXPECT_GE(n[grpc::StatusCode::RESOURCE_EXHAUSTED], kStreams - 32);
  for (const auto& s : statuses) {
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      EXPECT_THAT(s.error_message(), HasSubstr("--max_buffered_mb=16"));
    }
  }
  // The budget came back: a new stream is read again (and refused for ending early).
  grpc::ClientContext c;
  c.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::PushReply reply;
  auto w = stub->Push(&c, &reply);
  w->Write(chunk);
  w->WritesDone();
  EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  stub.reset();
  kill(pid, SIGTERM);
  EXPECT_EQ(Wait(pid), 0);
}

}  // namespace
}  // namespace tern
