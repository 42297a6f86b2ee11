// tern_swarm: thousands of federated clients in one process, for measuring the aggregator under
// load (bench/scale/run.sh, docs/benchmarks.md "The aggregator at 10,000 clients").
//
// Every simulated client joins, long-polls Fetch, and on a TRAIN task pushes a tiny update at
// once (no training: the point is the server's work per client). All calls go through gRPC's
// callback API over a few channels, so 10,000 clients need no 10,000 threads. A monitor thread
// polls Status and records when each round closes; at the end the swarm prints one line of
// results (round time, Push latency percentiles, failed calls by code, and, given
// --server_pid, the server's CPU seconds and resident memory over the measured rounds), then
// its anchor, measured in the same run: the same pushes into a gRPC sink that only reads them
// (no decoding, no rules, no log), as many at once as a round took, and the ratio.
//
// Thread-safety: the reactors run on gRPC's threads; shared counters are atomics or guarded by
// Swarm::mu_.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/chunking.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "core/rpc/server.h"
#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"
#include "tern/v1/server.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:7000", "the aggregator's host:port");
ABSL_FLAG(std::string, run_id, "tern", "the server's run id");
ABSL_FLAG(int, clients, 1000, "simulated clients");
ABSL_FLAG(int, channels, 8, "gRPC channels (TCP connections) the clients share");
ABSL_FLAG(int, params, 7850, "parameters of the model the swarm offers (7850: 31 kB, logistic)");
ABSL_FLAG(int, rounds, 5, "rounds to measure after every client has joined");
ABSL_FLAG(int, fetch_wait_ms, 5000, "each Fetch's long poll (as tern client)");
ABSL_FLAG(double, call_timeout_s, 30, "deadline of every call beyond its long poll");
ABSL_FLAG(int, join_window, 256, "Join calls in flight at once");
ABSL_FLAG(int, server_pid, 0, "the server's pid, for its CPU seconds and resident memory");
ABSL_FLAG(double, give_up_s, 600, "stop (and fail) after this long");
ABSL_FLAG(bool, anchor, true,
          "after the rounds, push the same updates into a gRPC sink in this process, as many at "
          "once as a round took, over as many connections: the round's floor (bare gRPC)");

namespace tern {
namespace {

// CPU seconds (user + system) and resident MiB of a process, from /proc.
struct ProcSample {
  double cpu_s = 0;
  double rss_mb = 0;
  double hwm_mb = 0;
};

ProcSample SampleProc(int pid) {
  ProcSample p;
  if (pid <= 0) return p;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(stat, line);
  // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::vector<std::string> f;
  for (std::string s; rest >> s;) f.push_back(s);
  if (f.size() > 12) {
    const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
    p.cpu_s = (std::stod(f[11]) + std::stod(f[12])) / hz;
  }
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string l; std::getline(status, l);) {
    if (l.rfind("VmRSS:", 0) == 0) p.rss_mb = std::stod(l.substr(6)) / 1024;
    if (l.rfind("VmHWM:", 0) == 0) p.hwm_mb = std::stod(l.substr(6)) / 1024;
  }
  return p;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

std::vector<ParamTensor> SwarmLayout(int params) {
  // One weight and one bias, as a logistic model; `params` is their sum.
  const int64_t bias = 10;
  const int64_t weight = std::max<int64_t>(1, params - bias);
  return {{"fc.weight", {weight}, 0, static_cast<size_t>(weight)},
          {"fc.bias", {bias}, static_cast<size_t>(weight), static_cast<size_t>(bias)}};
}

class Swarm;

// The anchor's server: an Aggregator whose Push reads the update whole and answers OK.
class SinkService final : public v1::Aggregator::CallbackService {
 public:
  grpc::ServerReadReactor<v1::UpdateRequest>* Push(grpc::CallbackServerContext*,
                                                   v1::UpdateReply*) override {
    class Reader final : public grpc::ServerReadReactor<v1::UpdateRequest> {
     public:
      Reader() { StartRead(&req_); }
      void OnReadDone(bool ok) override {
        if (ok) {
          StartRead(&req_);
        } else {
          Finish(grpc::Status::OK);
        }
      }
      void OnDone() override { delete this; }

     private:
      v1::UpdateRequest req_;
    };
    return new Reader();
  }
};

// One simulated client: Join, then Fetch (long poll) and Push, forever, until DONE or stop.
class SimClient {
 public:
  SimClient(Swarm* swarm, int index, v1::Aggregator::Stub* stub)
      : swarm_(swarm), index_(index), stub_(stub) {}
  void Join();
  void Fetch();
  void Push(uint64_t round);
  // Tries `then` again in 200 ms (after a failed call).
  void Later(void (SimClient::*then)());

  // Where the client is, for the stall report.
  enum State : int { kJoining, kFetching, kPushing, kRetrying };
  void Enter(State s) {
    state_ = s;
    since_ns_ = absl::GetCurrentTimeNanos();
  }
  State state() const { return static_cast<State>(state_.load()); }
  int64_t since_ns() const { return since_ns_.load(); }

  Swarm* swarm() const { return swarm_; }
  v1::Aggregator::Stub* stub() const { return stub_; }
  uint32_t id() const { return id_; }
  int index() const { return index_; }
  void set_id(uint32_t id) { id_ = id; }

 private:
  Swarm* const swarm_;
  const int index_;
  v1::Aggregator::Stub* const stub_;
  uint32_t id_ = 0;
  std::unique_ptr<grpc::ClientContext> join_ctx_;  // one per attempt
  v1::JoinRequest join_req_;
  v1::JoinReply join_reply_;
  grpc::Alarm later_;
  std::atomic<int> state_{kJoining};
  std::atomic<int64_t> since_ns_{0};
};

class Swarm {
 public:
  Swarm() : layout_(SwarmLayout(absl::GetFlag(FLAGS_params))) {}

  int Run();

  // Callbacks from the clients.
  void Joined();
  void Failed(const char* what, const grpc::Status& s);
  void Pushed(double seconds, bool ok);
  void FetchDone(bool done) {
    ++fetches_;
    if (done) ClientDone();
  }
  void ClientDone() {
    if (++clients_done_ == clients_.size()) all_done_.Notify();
  }
  bool stopping() const { return stopping_.load(); }
  absl::Duration call_timeout() const { return call_timeout_; }
  // The update's chunks for `round` (the same values from every client), made once.
  std::shared_ptr<const std::vector<v1::BundleChunk>> UpdateChunks(uint64_t round);

 private:
  absl::Status OfferModel(v1::Aggregator::Stub& stub);
  void StartJoins();
  // Returns the server's sample at the first close after every client joined.
  ProcSample Monitor(v1::Aggregator::Stub& stub, int pid);
  void Report(const ProcSample& before, const ProcSample& after);
  // The anchor (--anchor): `reps` bursts of `k` concurrent pushes of a round's update into a
  // sink in this process, over as many connections as the swarm's; the bursts' seconds.
  absl::StatusOr<std::vector<double>> Anchor(int k, int reps);
  void ReportAnchor(int k, const std::vector<double>& seconds) const;
  // To stderr: how many clients are in which state, and which have been stuck in one.
  void ReportStall() const;

  const std::vector<ParamTensor> layout_;
  const absl::Duration call_timeout_ = absl::Seconds(absl::GetFlag(FLAGS_call_timeout_s));
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Aggregator::Stub>> stubs_;
  std::vector<std::unique_ptr<SimClient>> clients_;
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> joins_started_{0}, joined_{0}, clients_done_{0};
  std::atomic<uint64_t> fetches_{0};
  absl::Notification all_joined_, all_done_;
  absl::Time joins_began_;
  absl::Duration join_time_;

  absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<const std::vector<v1::BundleChunk>>> update_chunks_
      ABSL_GUARDED_BY(mu_);
  std::vector<double> push_s_ ABSL_GUARDED_BY(mu_);  // latencies of the measured rounds
  bool measuring_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t pushes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t> failures_ ABSL_GUARDED_BY(mu_);  // "Fetch DEADLINE_EXCEEDED"
  std::vector<double> round_s_;                                    // monitor thread only
  std::vector<uint32_t> round_updates_;                            // monitor thread only
};

// ---- SimClient ------------------------------------------------------------------------------

void SimClient::Join() {
  join_req_.set_run_id(absl::GetFlag(FLAGS_run_id));
  join_req_.set_name(absl::StrCat("swarm-", index_));
  join_req_.set_num_samples(60);
  join_req_.set_client_id(-1);
  join_ctx_ = std::make_unique<grpc::ClientContext>();
  join_ctx_->set_deadline(absl::ToChronoTime(absl::Now() + swarm_->call_timeout()));
  stub_->async()->Join(join_ctx_.get(), &join_req_, &join_reply_, [this](grpc::Status s) {
    if (!s.ok()) {
      swarm_->Failed("Join", s);
      return Later(&SimClient::Join);
    }
    id_ = join_reply_.client_id();
    swarm_->Joined();
  });
}

void SimClient::Later(void (SimClient::*then)()) {
  Enter(kRetrying);
  later_.Set(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)),
             [this, then](bool) { (this->*then)(); });
}

// A Fetch long poll: the task, then (TRAIN) the model's chunks, which the swarm drops.
class FetchCall final : public grpc::ClientReadReactor<v1::FetchReply> {
 public:
  explicit FetchCall(SimClient* c) : c_(c) {
    req_.set_client_id(c->id());
    req_.set_max_wait_ms(static_cast<uint32_t>(absl::GetFlag(FLAGS_fetch_wait_ms)));
    req_.set_have_round(-1);
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() +
                                         absl::Milliseconds(absl::GetFlag(FLAGS_fetch_wait_ms)) +
                                         c->swarm()->call_timeout()));
    c->stub()->async()->Fetch(&ctx_, &req_, this);
    StartRead(&reply_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    if (first_) task_ = reply_.task();
    first_ = false;
    StartRead(&reply_);
  }
  void OnDone(const grpc::Status& s) override {
    SimClient* c = c_;
    const v1::Task task = task_;
    const bool got = !first_;
    delete this;
    Swarm* swarm = c->swarm();
    if (!s.ok() || !got) {
      swarm->Failed("Fetch", s.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "no task") : s);
      if (swarm->stopping()) return swarm->ClientDone();
      return c->Later(&SimClient::Fetch);
    }
    swarm->FetchDone(task.kind() == v1::Task::DONE);
    if (task.kind() == v1::Task::DONE) return;
    if (swarm->stopping()) return swarm->ClientDone();
    if (task.kind() == v1::Task::TRAIN) return c->Push(task.round());
    c->Fetch();
  }

 private:
  SimClient* const c_;
  grpc::ClientContext ctx_;
  v1::FetchRequest req_;
  v1::FetchReply reply_;
  v1::Task task_;
  bool first_ = true;
};

// One Push: the chunks in order (the first with `info`, when given), then `done`
// with the server's verdict and the seconds from the call's start to it. Serves the simulated
// clients and the anchor alike.
class PushCall final : public grpc::ClientWriteReactor<v1::UpdateRequest> {
 public:
  using Done = std::function<void(const grpc::Status&, double seconds)>;

  PushCall(v1::Aggregator::Stub* stub, std::shared_ptr<const std::vector<v1::BundleChunk>> chunks,
           const std::optional<v1::UpdateInfo>& info, absl::Duration timeout, Done done)
      : chunks_(std::move(chunks)), done_(std::move(done)), started_(absl::Now()) {
    ctx_.set_deadline(absl::ToChronoTime(started_ + timeout));
    stub->async()->Push(&ctx_, &reply_, this);
    if (info) *req_.mutable_info() = *info;
    WriteNext();
    StartCall();
  }
  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnDone(const grpc::Status& s) override {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - started_);
    Done done = std::move(done_);
    delete this;
    done(s, seconds);
  }

 private:
  void WriteNext() {
    if (next_ == chunks_->size()) {
      StartWritesDone();
      return;
    }
    if (next_ > 0) req_.clear_info();
    *req_.mutable_chunk() = (*chunks_)[next_++];
    StartWrite(&req_);
  }

  const std::shared_ptr<const std::vector<v1::BundleChunk>> chunks_;
  Done done_;
  const absl::Time started_;
  grpc::ClientContext ctx_;
  v1::UpdateRequest req_;
  v1::UpdateReply reply_;
  size_t next_ = 0;
};

void SimClient::Fetch() {
  Enter(kFetching);
  new FetchCall(this);
}
void SimClient::Push(uint64_t round) {
  Enter(kPushing);
  v1::UpdateInfo info;
  info.set_client_id(id());
  info.set_round(round);
  info.set_weight(60);
  info.set_loss(1.0f);
  info.set_batch(32);
  new PushCall(stub(), swarm()->UpdateChunks(round), info, swarm()->call_timeout(),
               [this](const grpc::Status& s, double seconds) {
                 Swarm* swarm = this->swarm();
                 swarm->Pushed(seconds, s.ok());
                 if (!s.ok()) swarm->Failed("Push", s);
                 if (swarm->stopping()) return swarm->ClientDone();
                 Fetch();
               });
}

// ---- Swarm ----------------------------------------------------------------------------------

std::shared_ptr<const std::vector<v1::BundleChunk>> Swarm::UpdateChunks(uint64_t round) {
  absl::MutexLock lock(&mu_);
  auto& slot = update_chunks_[round];
  if (slot == nullptr) {
    // A small step of the same size from everyone: FedAvg moves, the norm guard stays quiet.
    std::vector<float> values(LayoutNumel(layout_), 1e-4f);
    v1::TensorBundle b = *FlatToBundle(layout_, values);
    b.set_run_id(absl::GetFlag(FLAGS_run_id));
    b.set_round(round);
    slot = std::make_shared<const std::vector<v1::BundleChunk>>(*ChunkBundle(b, round));
  }
  return slot;
}

void Swarm::Joined() {
  const size_t n = clients_.size();
  if (++joined_ == n) {
    join_time_ = absl::Now() - joins_began_;
    all_joined_.Notify();
  }
  // Keep the window full.
  const size_t next = joins_started_++;
  if (next < n) clients_[next]->Join();
}

void Swarm::Failed(const char* what, const grpc::Status& s) {
  absl::MutexLock lock(&mu_);
  ++failures_[absl::StrCat(what, " ", s.error_code())];
}

void Swarm::Pushed(double seconds, bool ok) {
  absl::MutexLock lock(&mu_);
  if (!measuring_) return;
  ++pushes_;
  if (ok) push_s_.push_back(seconds);
}

absl::Status Swarm::OfferModel(v1::Aggregator::Stub& stub) {
  grpc::ClientContext jctx;
  jctx.set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
  v1::JoinRequest jr;
  jr.set_run_id(absl::GetFlag(FLAGS_run_id));
  jr.set_name("swarm-init");
  jr.set_client_id(-1);
  v1::JoinReply reply;
  if (grpc::Status s = stub.Join(&jctx, jr, &reply); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("Join: ", s.error_message()));
  }
  if (!reply.model_needed()) return absl::OkStatus();
  std::vector<float> zeros(LayoutNumel(layout_), 0.0f);
  v1::TensorBundle b = *FlatToBundle(layout_, zeros);
  b.set_run_id(absl::GetFlag(FLAGS_run_id));
  grpc::ClientContext ictx;
  ictx.set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
  v1::InitModelReply ir;
  absl::StatusOr<std::vector<v1::BundleChunk>> chunks = ChunkBundle(b, 0);
  if (!chunks.ok()) return chunks.status();
  auto writer = stub.InitModel(&ictx, &ir);
  bool first = true;
  for (v1::BundleChunk& ch : *chunks) {
    v1::InitModelRequest req;
    if (first) req.set_client_id(reply.client_id());
    first = false;
    *req.mutable_chunk() = std::move(ch);
    writer->Write(req);
  }
  writer->WritesDone();
  if (grpc::Status s = writer->Finish(); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("InitModel: ", s.error_message()));
  }
  // The client that offered the model takes no part: left joined, it would be sampled and hold
  // rounds until their deadline.
  grpc::ClientContext lctx;
  lctx.set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
  v1::LeaveRequest lr;
  lr.set_client_id(reply.client_id());
  v1::LeaveReply lreply;
  if (grpc::Status s = stub.Leave(&lctx, lr, &lreply); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("Leave: ", s.error_message()));
  }
  return absl::OkStatus();
}

void Swarm::StartJoins() {
  joins_began_ = absl::Now();
  const size_t window = static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_join_window)));
  // Joins that finish start the next ones (Joined) while this loop runs: both take indices from
  // joins_started_.
  for (size_t k = 0; k < window; ++k) {
    const size_t i = joins_started_++;
    if (i >= clients_.size()) break;
    clients_[i]->Join();
  }
}

// Polls Status every 20 ms: records each round's close, ends after --rounds measured ones.
ProcSample Swarm::Monitor(v1::Aggregator::Stub& stub, int pid) {
  ProcSample at_start;
  const uint64_t rounds = static_cast<uint64_t>(absl::GetFlag(FLAGS_rounds));
  uint64_t first_round = 0, last_round = 0;
  double last_close = 0;
  const absl::Time give_up = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_give_up_s));
  absl::Time last_progress = absl::Now();
  while (absl::Now() < give_up && (first_round == 0 || last_round - first_round < rounds)) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ServerStatus st;
    if (stub.Status(&ctx, v1::StatusRequest(), &st).ok() && st.round() > last_round) {
      // The first close after every client joined starts the clock. Rounds that closed between
      // two polls share the interval.
      if (first_round == 0) {
        at_start = SampleProc(pid);
        first_round = st.round();
        absl::MutexLock lock(&mu_);
        measuring_ = true;
      } else {
        const uint64_t closed = st.round() - last_round;
        for (uint64_t i = 0; i < closed; ++i) {
          round_s_.push_back((st.round_closed_unix_s() - last_close) / static_cast<double>(closed));
        }
        round_updates_.push_back(st.last_round_updates());
      }
      last_round = st.round();
      last_close = st.round_closed_unix_s();
      last_progress = absl::Now();
      if (st.done()) break;
    }
    if (absl::Now() - last_progress > absl::Seconds(15)) {
      ReportStall();
      last_progress = absl::Now();
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return at_start;
}

void Swarm::ReportStall() const {
  int count[4] = {0, 0, 0, 0};
  std::string stuck;
  const int64_t now = absl::GetCurrentTimeNanos();
  for (const auto& c : clients_) {
    ++count[c->state()];
    if (now - c->since_ns() > int64_t{10} * 1000000000 && stuck.size() < 200) {
      absl::StrAppend(&stuck, " ", c->id(), "(", c->state(), ")");
    }
  }
  std::fprintf(stderr,
               "tern_swarm: no round closed for 15 s; joining %d fetching %d pushing %d "
               "retrying %d; in one state for over 10 s (id(state)):%s\n",
               count[0], count[1], count[2], count[3], stuck.c_str());
}

void Swarm::Report(const ProcSample& before, const ProcSample& after) {
  absl::MutexLock lock(&mu_);
  std::string failures;
  uint64_t deadline = 0;
  for (const auto& [what, n] : failures_) {
    absl::StrAppend(&failures, failures.empty() ? "" : ", ", what, ":", n);
    if (what.find(" 4") == what.size() - 2) deadline += n;  // DEADLINE_EXCEEDED = 4
  }
  std::vector<double> updates(round_updates_.begin(), round_updates_.end());
  std::printf(
      "clients %zu | joined in %.1f s | rounds %zu | round s p50 %.2f max %.2f | updates/round "
      "p50 %.0f | push s p50 %.3f p99 %.3f max %.3f (%zu) | fetches %llu | deadline exceeded "
      "%llu | server cpu s %.1f (%.2f per round) | server rss MB %.0f (peak %.0f)\n",
      clients_.size(), absl::ToDoubleSeconds(join_time_), round_s_.size(),
      Percentile(round_s_, 0.5),
      round_s_.empty() ? 0 : *std::max_element(round_s_.begin(), round_s_.end()),
      Percentile(updates, 0.5), Percentile(push_s_, 0.5), Percentile(push_s_, 0.99),
      Percentile(push_s_, 1.0), push_s_.size(), static_cast<unsigned long long>(fetches_.load()),
      static_cast<unsigned long long>(deadline), after.cpu_s - before.cpu_s,
      round_s_.empty() ? 0 : (after.cpu_s - before.cpu_s) / static_cast<double>(round_s_.size()),
      after.rss_mb, after.hwm_mb);
  if (!failures.empty()) std::printf("failed calls (method code:count): %s\n", failures.c_str());
  std::fflush(stdout);
}

absl::StatusOr<std::vector<double>> Swarm::Anchor(int k, int reps) {
  SinkService sink;
  int port = 0;
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server,
                        StartGrpcServer("127.0.0.1:0", {&sink}, &port));
  std::vector<std::unique_ptr<v1::Aggregator::Stub>> stubs;
  for (size_t i = 0; i < channels_.size(); ++i) {
    grpc::ChannelArguments args = TernChannelArguments();
    args.SetInt("tern.swarm_channel", static_cast<int>(i));
    stubs.push_back(v1::Aggregator::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args)));
  }
  const auto chunks = UpdateChunks(1);
  std::vector<double> seconds;
  std::atomic<int> failed{0};
  for (int rep = 0; rep < reps; ++rep) {
    absl::BlockingCounter done(k);
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < k; ++i) {
      new PushCall(stubs[static_cast<size_t>(i) % stubs.size()].get(), chunks, std::nullopt,
                   call_timeout_, [&done, &failed](const grpc::Status& s, double) {
                     if (!s.ok()) ++failed;
                     done.DecrementCount();
                   });
    }
    done.Wait();
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  if (failed > 0) return absl::InternalError(absl::StrCat(failed.load(), " anchor pushes failed"));
  return seconds;
}

void Swarm::ReportAnchor(int k, const std::vector<double>& seconds) const {
  const double anchor = Percentile(seconds, 0.5);
  const double round = Percentile(round_s_, 0.5);
  std::printf(
      "anchor: %d pushes at once into a gRPC sink in this process over %zu connections | burst s "
      "p50 %.3f max %.3f (%zu) | round / anchor %.1fx\n",
      k, channels_.size(), anchor, Percentile(seconds, 1.0), seconds.size(),
      anchor > 0 ? round / anchor : 0);
  std::fflush(stdout);
}

int Swarm::Run() {
  const int n = absl::GetFlag(FLAGS_clients);
  const int nch = std::max(1, absl::GetFlag(FLAGS_channels));
  for (int i = 0; i < nch; ++i) {
    grpc::ChannelArguments args = TernChannelArguments();
    args.SetInt("tern.swarm_channel", i);  // a distinct argument: a connection of its own
    channels_.push_back(grpc::CreateCustomChannel(absl::GetFlag(FLAGS_server),
                                                  grpc::InsecureChannelCredentials(), args));
    stubs_.push_back(v1::Aggregator::NewStub(channels_.back()));
  }
  if (absl::Status s = OfferModel(*stubs_[0]); !s.ok()) {
    std::fprintf(stderr, "tern_swarm: %s\n", s.ToString().c_str());
    return 1;
  }
  for (int i = 0; i < n; ++i) {
    clients_.push_back(std::make_unique<SimClient>(this, i, stubs_[i % nch].get()));
  }
  StartJoins();
  const absl::Duration give_up = absl::Seconds(absl::GetFlag(FLAGS_give_up_s));
  if (!all_joined_.WaitForNotificationWithTimeout(give_up)) {
    std::fprintf(stderr, "tern_swarm: only %zu of %d clients joined\n", joined_.load(), n);
    return 1;
  }
  for (auto& c : clients_) c->Fetch();
  // The clock starts at the first round that closes after everyone joined.
  const int pid = absl::GetFlag(FLAGS_server_pid);
  auto stub = v1::Aggregator::NewStub(channels_[0]);
  const ProcSample before = Monitor(*stub, pid);
  const ProcSample after = SampleProc(pid);
  stopping_ = true;
  // Every client stops at its next call's end; long polls end within --fetch_wait_ms.
  if (!all_done_.WaitForNotificationWithTimeout(
          absl::Milliseconds(absl::GetFlag(FLAGS_fetch_wait_ms)) + call_timeout_)) {
    std::fprintf(stderr, "tern_swarm: %zu of %zu clients stopped\n", clients_done_.load(),
                 clients_.size());
  }
  Report(before, after);
  const bool enough = static_cast<int>(round_s_.size()) >= absl::GetFlag(FLAGS_rounds);
  if (!enough) return 1;
  if (absl::GetFlag(FLAGS_anchor)) {
    std::vector<double> updates(round_updates_.begin(), round_updates_.end());
    const int k = std::max(1, static_cast<int>(Percentile(updates, 0.5)));
    absl::StatusOr<std::vector<double>> seconds = Anchor(k, absl::GetFlag(FLAGS_rounds));
    if (!seconds.ok()) {
      std::fprintf(stderr, "tern_swarm: anchor: %s\n", seconds.status().ToString().c_str());
      return 1;
    }
    ReportAnchor(k, *seconds);
  }
  return 0;
}

}  // namespace
}  // namespace tern

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as the daemons
  tern::Swarm swarm;
  const int rc = swarm.Run();
  // Reactors may still be in flight; the process ends without tearing them down.
  std::fflush(stdout);
  _exit(rc);
}
