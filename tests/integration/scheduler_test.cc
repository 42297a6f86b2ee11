// Integration test with real processes: `tern scheduler` and four `tern worker` gossip daemons
// registered with it; one worker is SIGKILLed and the scheduler must notice within its heartbeat
// timeout and hand the survivors a repaired ring, which their engines then mix over.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/rpc/channel.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tern/v1/scheduler.grpc.pb.h"
#include "tests/integration/process_util.h"

namespace tern {
namespace {

int WaitForPort(const std::string& file) {
  int port = 0;
  for (int tries = 0; tries < 600 && port == 0; ++tries) {
    std::ifstream(file) >> port;
    if (port == 0) absl::SleepFor(absl::Milliseconds(50));
  }
  return port;
}

// The ids in `"key":[a,b]` of a round-log line.
std::set<int> Ids(const std::string& line, const std::string& key) {
  std::set<int> out;
  const std::string tag = "\"" + key + "\":[";
  const size_t at = line.find(tag);
  if (at == std::string::npos) return out;
  const size_t end = line.find(']', at);
  for (absl::string_view v : absl::StrSplit(line.substr(at + tag.size(), end - at - tag.size()),
                                            ',', absl::SkipEmpty())) {
    out.insert(std::atoi(std::string(v).c_str()));
  }
  return out;
}

class ScheduledWorkers : public ::testing::Test {
 protected:
  static constexpr int kTimeoutMs = 1500;

  void SetUp() override {
    dir_ = MakeTempDir();
    scheduler_ = Spawn({"scheduler", "--heartbeat_interval_ms=250",
                        absl::StrCat("--heartbeat_timeout_ms=", kTimeoutMs),
                        absl::StrCat("--port_file=", dir_, "/scheduler.port")},
                       dir_ + "/scheduler.log");
    const int sport = WaitForPort(dir_ + "/scheduler.port");
    ASSERT_GT(sport, 0) << "the scheduler did not start";
    stub_ = v1::Scheduler::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", sport)));
    for (int i = 0; i < 4; ++i) {
      workers_.push_back(Spawn(
          {"worker", absl::StrCat("--id=", i), "--workers=4", "--algorithm=dpsgd", "--epochs=20",
           "--batch=64", "--round_timeout=2", absl::StrCat("--scheduler=127.0.0.1:", sport),
           absl::StrCat("--port_file=", dir_, "/", i, ".port"),
           absl::StrCat("--peers_file=", dir_, "/peers.txt"),
           absl::StrCat("--round_log=", dir_, "/rounds-", i, ".jsonl")},
          absl::StrCat(dir_, "/worker-", i, ".log")));
    }
    std::string peers;
    for (int i = 0; i < 4; ++i) {
      const int port = WaitForPort(absl::StrCat(dir_, "/", i, ".port"));
      ASSERT_GT(port, 0) << "worker " << i << " did not start";
      absl::StrAppend(&peers, "127.0.0.1:", port, "\n");
    }
    std::ofstream(dir_ + "/peers.tmp") << peers;
    std::rename((dir_ + "/peers.tmp").c_str(), (dir_ + "/peers.txt").c_str());
  }
  void TearDown() override {
    stub_.reset();
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i] > 0) kill(workers_[i], SIGTERM);
    }
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i] > 0) {
        EXPECT_EQ(Wait(workers_[i]), 0) << "worker " << i;
      }
    }
    kill(scheduler_, SIGTERM);
    EXPECT_EQ(Wait(scheduler_), 0);
  }

  v1::MembersReply Members() {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::MembersReply r;
    EXPECT_TRUE(stub_->Members(&ctx, v1::MembersRequest(), &r).ok());
    return r;
  }
  std::set<uint32_t> Neighbours(uint32_t id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ViewRequest req;
    req.set_worker_id(id);
    v1::View v;
    grpc::Status s = stub_->GetView(&ctx, req, &v);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::set<uint32_t> out;
    for (const auto& n : v.neighbors()) out.insert(n.id());
    return out;
  }
  int Steps(int i) {
    return static_cast<int>(Lines(absl::StrCat(dir_, "/rounds-", i, ".jsonl")).size());
  }

  std::string dir_;
  pid_t scheduler_ = 0;
  std::vector<pid_t> workers_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
};

TEST_F(ScheduledWorkers, ADeadWorkerIsNoticedWithinTheHeartbeatTimeoutAndItsNeighboursReassigned) {
  // Every worker registered and training.
  for (int tries = 0; tries < 600 && (Members().members_size() < 4 || Steps(1) < 10); ++tries) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(Members().members_size(), 4);
  ASSERT_GE(Steps(1), 10);
  EXPECT_EQ(Neighbours(1), (std::set<uint32_t>{0, 2}));
  EXPECT_EQ(Neighbours(3), (std::set<uint32_t>{0, 2}));

  // (A loaded machine could make a live worker miss its heartbeats: count only what follows.)
  const int failures_before = Members().failures_size();
  kill(workers_[2], SIGKILL);
  const absl::Time killed = absl::Now();
  EXPECT_EQ(Wait(workers_[2]), 128 + SIGKILL);
  workers_[2] = 0;
  auto dead2 = [&](const v1::MembersReply& r) -> const v1::Failure* {
    for (int k = failures_before; k < r.failures_size(); ++k) {
      if (r.failures(k).id() == 2) return &r.failures(k);
    }
    return nullptr;
  };
  v1::MembersReply m;
  do {
    absl::SleepFor(absl::Milliseconds(10));
    m = Members();
  } while (dead2(m) == nullptr && absl::Now() - killed < absl::Seconds(10));
  const double noticed_s = absl::ToDoubleSeconds(absl::Now() - killed);
  const v1::Failure* f = dead2(m);
  ASSERT_NE(f, nullptr) << "worker 2 never declared dead";
  // Declared dead once silent for the timeout: its last heartbeat was < 250 ms before the
  // kill, so the kill-to-notice time is at most the timeout (plus the scheduler's 20 ms tick
  // and this loop's polling).
  EXPECT_GE(f->detected_after_s(), kTimeoutMs / 1000.0);
  EXPECT_LE(f->detected_after_s(), kTimeoutMs / 1000.0 + 0.25);
  EXPECT_LE(noticed_s, kTimeoutMs / 1000.0 + 0.5) << "noticed " << noticed_s << " s after";
  std::printf(
      "worker 2 SIGKILLed: declared dead %.3f s later (%.3f s after its last heartbeat; "
      "timeout %.1f s)\n",
      noticed_s, f->detected_after_s(), kTimeoutMs / 1000.0);
  EXPECT_EQ(m.members_size(), 3);
  EXPECT_EQ(Neighbours(1), (std::set<uint32_t>{0, 3}));
  EXPECT_EQ(Neighbours(3), (std::set<uint32_t>{0, 1}));

  // The survivors' engines switch to the repaired ring at the scheduler's round: worker 1 then
  // mixes with 0 and 3, worker 3 with 0 and 1, and rounds go on.
  auto mixes = [&](int i, std::set<int> want) {
    for (const std::string& line : Lines(absl::StrCat(dir_, "/rounds-", i, ".jsonl"))) {
      if (Field(line, "step") >= m.from_round() && Ids(line, "mixed_ids") == want) return true;
    }
    return false;
  };
  bool repaired = false;
  for (int tries = 0; tries < 300 && !repaired; ++tries) {
    absl::SleepFor(absl::Milliseconds(100));
    repaired = mixes(1, {0, 3}) && mixes(3, {0, 1});
  }
  EXPECT_TRUE(repaired) << "worker 1 / 3 never mixed over the repaired ring; from round "
                        << m.from_round();
}

// Long polls held open against a live scheduler: past the per-worker and the total limit the
// next is refused at once with RESOURCE_EXHAUSTED naming its flag; the waiting ones end at their
// wait, and then their slots are free again.
TEST(SchedulerLimits, LongPollsPastTheLimitsAreRefusedAndTheSlotsComeBack) {
  const std::string dir = MakeTempDir();
  const pid_t pid = Spawn({"scheduler", "--max_waiting_calls=3", "--max_waiting_per_worker=2",
                           absl::StrCat("--port_file=", dir, "/scheduler.port")},
                          dir + "/scheduler.log");
  const int port = WaitForPort(dir + "/scheduler.port");
  ASSERT_GT(port, 0) << "the scheduler did not start";
  auto stub = v1::Scheduler::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", port)));
  for (int id = 0; id < 3; ++id) {  // three members: a barrier of two arrivals stays closed
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::MemberRegisterRequest r;
    r.set_run_id("tern");
    r.set_worker_id(id);
    v1::MemberRegisterReply reply;
    ASSERT_TRUE(stub->Register(&ctx, r, &reply).ok());
  }
  struct Call {
    grpc::ClientContext ctx;
    v1::BarrierRequest req;
    v1::BarrierReply reply;
    absl::Notification done;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  auto barrier = [&](uint32_t worker) -> Call* {
    auto c = std::make_unique<Call>();
    c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    c->req.set_worker_id(worker);
    c->req.set_name("b");
    c->req.set_max_wait_ms(2000);
    Call* p = c.get();
    stub->async()->Barrier(&p->ctx, &p->req, &p->reply, [p](grpc::Status s) {
      p->status = std::move(s);
      p->done.Notify();
    });
    calls.push_back(std::move(c));
    return p;
  };
  Call* w0a = barrier(0);
  Call* w0b = barrier(0);
  absl::SleepFor(absl::Milliseconds(200));  // both parked
  Call* w0c = barrier(0);
  ASSERT_TRUE(w0c->done.WaitForNotificationWithTimeout(absl::Seconds(1)));
  EXPECT_EQ(w0c->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(w0c->status.error_message(), ::testing::HasSubstr("--max_waiting_per_worker=2"));
  barrier(1);
  absl::SleepFor(absl::Milliseconds(200));
  Call* w2 = barrier(2);
  ASSERT_TRUE(w2->done.WaitForNotificationWithTimeout(absl::Seconds(1)));
  EXPECT_EQ(w2->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(w2->status.error_message(), ::testing::HasSubstr("--max_waiting_calls=3"));
  // The parked ones answer at the end of their 2 s wait, not released (worker 2 never came).
  for (Call* c : {w0a, w0b}) {
    ASSERT_TRUE(c->done.WaitForNotificationWithTimeout(absl::Seconds(5)));
    EXPECT_TRUE(c->status.ok()) << c->status.error_message();
    EXPECT_FALSE(c->reply.released());
  }
  for (auto& c : calls) c->done.WaitForNotification();
  // Slots are back: worker 2 arrives, and the barrier opens for it at once.
  Call* again = barrier(2);
  ASSERT_TRUE(again->done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(again->status.ok()) << again->status.error_message();
  EXPECT_TRUE(again->reply.released());
  kill(pid, SIGTERM);
  Wait(pid);
}

}  // namespace
}  // namespace tern
