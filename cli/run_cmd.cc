// tern run: starts N `tern worker` processes on 127.0.0.1 with the built-in trainer, watches
// them train (progress bar, metrics of the averaged model), and leaves a run folder with
// metrics.jsonl, run.json, the workers' logs and report.html. Ctrl-C stops everything cleanly
// and still writes what was measured.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "cli/local_cluster.h"
#include "cli/process.h"
#include "cli/report.h"
#include "cli/run_health.h"
#include "clients/cpp/builtin_trainer.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/train_flags.h"
#include "clients/flags/worker_flags.h"
#include "common/file_util.h"
#include "common/json_lines.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/security.h"
#include "core/rpc/status.h"
#include "core/workload/builtin_model.h"
#include "core/workload/dataset.h"
#include "core/workload/partition.h"
#include "grpcpp/grpcpp.h"
#include "kernels/builtin.h"
#include "tern/v1/records.pb.h"
#include "tern/v1/worker.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, algorithm);
ABSL_DECLARE_FLAG(std::string, codec);
ABSL_DECLARE_FLAG(std::string, lr_schedule);
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, mode);
ABSL_DECLARE_FLAG(std::string, scheduler);

ABSL_FLAG(bool, tls, false,
          "run: mutual TLS between every process of the run (certificates made for it in the run "
          "folder, certs/); bench transport: also push through a receiver with mutual TLS");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, evals_per_epoch, 2,
          "run: evaluations of the averaged model per epoch");
ABSL_FLAG(std::string, name, "", "run: run name (default <algorithm>-<codec>-<topology>)");
ABSL_FLAG(std::string, kill_worker, "",
          "run: fault injection, ID@STEP[,ID@STEP...]: SIGKILL worker ID once it has done STEP "
          "steps (its trainer does, at that step's end: --crash_after_steps)");

ABSL_FLAG(std::string, join_worker, "",
          "run: an elastic run's joins, STEP[,STEP...]: start one more worker (the next id) once "
          "the furthest worker has done STEP steps; it joins the running run with the group's "
          "state (needs --scheduler)");
ABSL_FLAG(std::string, leave_worker, "",
          "run: graceful leaves, ID@STEP[,ID@STEP...]: stop worker ID (SIGTERM: it leaves the "
          "run, a membership epoch) once it has done STEP steps (needs --scheduler)");

ABSL_FLAG(std::vector<std::string>, worker_hosts, {},
          "run: the address each worker listens on and is reached at, one per worker (default "
          "127.0.0.1); with --worker_netns, an address in that worker's namespace");
ABSL_FLAG(std::vector<std::string>, worker_netns, {},
          "run: a network namespace per worker (`ip netns exec`, root only), for partitions made "
          "with namespaces: bench/faults/partition.sh");

namespace tern {
namespace {

struct Child {
  ChildProcess* proc = nullptr;  // owned by the LocalCluster; null for a joiner not started yet
  std::unique_ptr<v1::Trainer::Stub> stub;
  v1::WorkerStats last;   // stats at the previous evaluation
  int64_t joined_at = 0;  // a joiner: the group's step when it was started (no snapshot before)
};

// Fetches a worker's snapshot of `step`: the parameters, or nullopt with `retry` saying whether
// asking again later can help.
std::optional<std::vector<float>> FetchSnapshot(Child& c, int64_t step,
                                                const std::vector<ParamTensor>& layout,
                                                const CodecRegistry& codecs, v1::WorkerStats* stats,
                                                bool* retry) {
  *retry = false;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::SnapshotRequest req;
  req.set_round(static_cast<uint64_t>(step));
  auto reader = c.stub->Snapshot(&ctx, req);
  v1::SnapshotReply first;
  absl::StatusOr<v1::TensorBundle> bundle = ReadChunkedBundle(reader.get(), &first);
  grpc::Status gs = reader->Finish();
  if (!gs.ok()) {
    *retry = gs.error_code() == grpc::StatusCode::UNAVAILABLE ||
             gs.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    // A joiner has no snapshot of the steps before the one it joined at: not worth a line.
    if (!*retry && !(c.joined_at > 0 && gs.error_code() == grpc::StatusCode::NOT_FOUND))
      std::fprintf(stderr, "\nworker %d: snapshot %lld: %s\n", c.proc->id,
                   static_cast<long long>(step), gs.error_message().c_str());
    return std::nullopt;
  }
  if (!bundle.ok()) return std::nullopt;
  *stats = first.stats();
  std::vector<float> x(LayoutNumel(layout));
  if (!BundleToFlat(*bundle, layout, codecs, absl::MakeSpan(x)).ok()) return std::nullopt;
  return x;
}

// What a gossip run is, from the flags, checked before anything starts.
struct GossipRun {
  int n = 0;
  int max = 0;                                  // workers there may be: n, and one per join
  std::vector<int64_t> joins;                   // --join_worker: the group's step of each
  std::vector<std::pair<int, int64_t>> leaves;  // --leave_worker: (worker, after steps)
  // Joins or leaves: the workers run elastic (--min_workers=n, --max_workers=max) on the
  // scheduler's rendezvous, with no peer list.
  bool elastic() const { return !joins.empty() || !leaves.empty(); }
  int epochs = 0;
  int64_t steps_per_epoch = 0;
  int64_t total = 0;
  int64_t every = 0;                           // steps between evaluations
  std::vector<std::pair<int, int64_t>> kills;  // --kill_worker: (worker, after steps)
};

// Checks the configuration here, so a typo fails before any process starts (exit 2).
absl::Status CheckGossipFlags(const WorkerRegistries& registries, GossipRun* run) {
  run->n = absl::GetFlag(FLAGS_workers).value;
  run->epochs = absl::GetFlag(FLAGS_epochs).value;
  if (run->n < 1 || run->n > 256 || run->epochs < 1) {
    return absl::InvalidArgumentError("need 1 <= --workers <= 256 and --epochs >= 1");
  }
  TERN_ASSIGN_OR_RETURN(EngineOptions eo, EngineOptionsFromFlags(0, run->n, 1, 1));
  TERN_RETURN_IF_ERROR(RoundEngine::Create(eo, &registries, nullptr).status());
  // What the workers' built-in trainers check at their start, checked here instead.
  TERN_RETURN_IF_ERROR(CheckDataFlags());
  TERN_ASSIGN_OR_RETURN(run->kills,
                        ParseKillList(absl::GetFlag(FLAGS_kill_worker), "kill_worker", run->n, 0));
  TERN_ASSIGN_OR_RETURN(
      run->leaves, ParseKillList(absl::GetFlag(FLAGS_leave_worker), "leave_worker", run->n, 1));
  for (absl::string_view v :
       absl::StrSplit(absl::GetFlag(FLAGS_join_worker), ',', absl::SkipEmpty())) {
    int64_t at = 0;
    if (!absl::SimpleAtoi(v, &at) || at < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--join_worker=", absl::GetFlag(FLAGS_join_worker), ": STEP[,STEP...], each >= 1"));
    }
    run->joins.push_back(at);
  }
  std::sort(run->joins.begin(), run->joins.end());
  run->max = run->n + static_cast<int>(run->joins.size());
  if (run->max > 256) return absl::InvalidArgumentError("more than 256 workers with the joins");
  if (run->elastic() && absl::GetFlag(FLAGS_scheduler).empty()) {
    return absl::InvalidArgumentError(
        "--join_worker and --leave_worker are membership epochs: they need --scheduler (local, "
        "or a running one's HOST:PORT)");
  }
  if (run->elastic() && !absl::GetFlag(FLAGS_worker_netns).empty()) {
    return absl::InvalidArgumentError(
        "--join_worker/--leave_worker with --worker_netns: not built");
  }
  return absl::OkStatus();
}

v1::RunConfig GossipConfig(const std::string& name, const GossipRun& run, const TrainTest& data,
                           size_t train_size) {
  v1::RunConfig c;
  c.set_name(name);
  c.set_mode("gossip");
  c.set_algorithm(absl::GetFlag(FLAGS_algorithm));
  c.set_codec(absl::GetFlag(FLAGS_codec));
  c.set_topology(EffectiveTopology());
  c.set_model(absl::GetFlag(FLAGS_model));
  c.set_partition(absl::GetFlag(FLAGS_partition));
  c.set_lr_schedule(absl::GetFlag(FLAGS_lr_schedule));
  c.set_data(data.test.source);
  c.set_workers(run.n);
  c.set_epochs(run.epochs);
  c.set_batch(absl::GetFlag(FLAGS_batch).value);
  c.set_lr(EffectiveLr());
  c.set_seed(static_cast<double>(absl::GetFlag(FLAGS_seed)));
  c.set_steps_per_epoch(static_cast<int32_t>(run.steps_per_epoch));
  c.set_total_steps(static_cast<int32_t>(run.total));
  c.set_train_examples(static_cast<int32_t>(train_size));
  c.set_synthetic(data.synthetic);
  if (absl::GetFlag(FLAGS_overlap)) {
    c.set_overlap(true);
    c.set_overlap_steps(absl::GetFlag(FLAGS_overlap_steps).value);
  }
  if (absl::GetFlag(FLAGS_bucket_mb).value > 0) {
    c.set_bucket_mb(static_cast<float>(absl::GetFlag(FLAGS_bucket_mb).value));
  }
  if (absl::GetFlag(FLAGS_algorithm) == "diloco") {
    EngineOptions defaults;
    const std::string outer = absl::GetFlag(FLAGS_outer);
    c.set_outer(outer.empty() ? defaults.algorithm_options.outer : outer);
    c.set_local_steps(absl::GetFlag(FLAGS_local_steps).value);
    c.set_merge_alpha(static_cast<float>(absl::GetFlag(FLAGS_merge_alpha).value));
    if (absl::GetFlag(FLAGS_keep_overlap)) c.set_keep_overlap(true);
    c.set_outer_delay(absl::GetFlag(FLAGS_outer_delay));
    if (absl::GetFlag(FLAGS_sync_steps).value > 0) {
      c.set_sync_steps(absl::GetFlag(FLAGS_sync_steps).value);
    }
    if (const std::string ladder = absl::GetFlag(FLAGS_codec_ladder); !ladder.empty()) {
      c.set_codec_ladder(ladder);
      c.set_cu_target(static_cast<float>(absl::GetFlag(FLAGS_cu_target).value));
    }
    if (const int max = absl::GetFlag(FLAGS_local_steps_max).value; max > 0) {
      c.set_local_steps_min(absl::GetFlag(FLAGS_local_steps_min).value);
      c.set_local_steps_max(max);
      c.set_cu_target(static_cast<float>(absl::GetFlag(FLAGS_cu_target).value));
      if (const int min = absl::GetFlag(FLAGS_fragments_min).value; min > 0) {
        c.set_fragments_min(min);
      }
    }
    if (absl::GetFlag(FLAGS_fragments).value > 1) {
      c.set_fragments(absl::GetFlag(FLAGS_fragments).value);
      c.set_fragment_cut(absl::GetFlag(FLAGS_fragment_cut));
    }
  }
  return c;
}

// The scheduler the workers report to: --scheduler=local starts a `tern scheduler` on
// 127.0.0.1 (heartbeats every 100 ms, dead after 1.5 s of silence), which repairs the gossip
// graph over the live workers when some die; another value is a running scheduler's address;
// "" none (the static graph only).
absl::StatusOr<std::string> SchedulerFor(LocalCluster& cluster) {
  const std::string flag = absl::GetFlag(FLAGS_scheduler);
  if (flag != "local") return flag;
  const std::string& dir = cluster.dir();
  ::unlink((dir + "/scheduler.port").c_str());
  ChildProcess* p = cluster.Start(
      "scheduler", 0,
      Concat({"scheduler", "--listen=127.0.0.1:0",
              absl::StrCat("--port_file=", dir, "/scheduler.port"),
              absl::StrCat("--run_id=", absl::GetFlag(FLAGS_run_id)),
              absl::StrCat("--topology=", EffectiveTopology()),
              absl::StrCat("--weights=", absl::GetFlag(FLAGS_weights)),
              "--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=1500",
              absl::StrCat("--log_level=", absl::GetFlag(FLAGS_log_level))},
             // With certificates, each worker registers as the id its name says.
             Concat(cluster.TlsArgs("scheduler"),
                    absl::GetFlag(FLAGS_tls) ? std::vector<std::string>{"--member_names=worker-*"}
                                             : std::vector<std::string>{})),
      "scheduler.log");
  return cluster.WaitForAddress(p, "scheduler.port", absl::Seconds(60));
}

// Worker i's entry of a per-worker list flag: `fallback` when the list is empty.
absl::StatusOr<std::string> PerWorker(const std::vector<std::string>& list, const char* flag, int n,
                                      int i, const std::string& fallback) {
  if (list.empty()) return fallback;
  if (static_cast<int>(list.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " has ", list.size(), " entries for ", n, " workers"));
  }
  return list[static_cast<size_t>(i)];
}

// Worker i's command line. An elastic run's workers find each other through the scheduler
// (no peer list) and admit joiners up to run.max.
std::vector<std::string> WorkerCommand(LocalCluster& cluster, const GossipRun& run, int i,
                                       const std::string& host, const std::string& scheduler) {
  const std::string& dir = cluster.dir();
  std::vector<std::string> args = {"worker",
                                   absl::StrCat("--id=", i),
                                   absl::StrCat("--listen=", host, ":0"),
                                   absl::StrCat("--port_file=", dir, "/worker-", i, ".port"),
                                   absl::StrCat("--snapshot_every=", run.every),
                                   absl::StrCat("--total_steps=", run.total),
                                   absl::StrCat("--round_log=", dir, "/worker-", i, ".steps.jsonl"),
                                   absl::StrCat("--log_level=", absl::GetFlag(FLAGS_log_level))};
  for (std::string& a : WorkerCountFlags(run.elastic(), run.n, run.max))
    args.push_back(std::move(a));
  if (!run.elastic()) args.push_back(absl::StrCat("--peers_file=", dir, "/peers.txt"));
  for (std::string& a : SharedTrainFlagArgs()) args.push_back(std::move(a));
  // --kill_worker: the worker's trainer kills it at its step's end exactly (a kill from here,
  // on a poll, could land anywhere in a step, an exchange's pushes half out included).
  for (const auto& [id, after] : run.kills) {
    if (id == i) args.push_back(absl::StrCat("--crash_after_steps=", after));
  }
  if (!scheduler.empty()) args.push_back("--scheduler=" + scheduler);
  // --worker_hosts in namespaces this run made for itself (bench/faults): a private network,
  // from which the launcher reads the workers' snapshots and counters (Trainer service) as
  // itself, or as anyone there when the run has no certificates.
  if (!IsLoopback(host + ":0")) {
    args.push_back("--plaintext");
    args.push_back(absl::GetFlag(FLAGS_tls) ? "--trainer_names=launcher" : "--trainer_names=*");
  }
  for (std::string& a : cluster.TlsArgs(absl::StrCat("worker-", i))) args.push_back(std::move(a));
  return args;
}

// Starts the workers, collects their ports and tells everyone where everyone is (an elastic
// run: the scheduler does). Room is left for the joiners; `scheduler` says where it is.
absl::StatusOr<std::vector<Child>> StartWorkers(LocalCluster& cluster, const GossipRun& run,
                                                std::string* scheduler) {
  const std::string& dir = cluster.dir();
  std::vector<std::string> hosts(run.n), netns(run.n);
  for (int i = 0; i < run.n; ++i) {
    TERN_ASSIGN_OR_RETURN(hosts[i], PerWorker(absl::GetFlag(FLAGS_worker_hosts), "worker_hosts",
                                              run.n, i, "127.0.0.1"));
    TERN_ASSIGN_OR_RETURN(
        netns[i], PerWorker(absl::GetFlag(FLAGS_worker_netns), "worker_netns", run.n, i, ""));
  }
  TERN_ASSIGN_OR_RETURN(*scheduler, SchedulerFor(cluster));
  ::unlink((dir + "/peers.txt").c_str());
  std::vector<Child> children(run.max);
  for (int i = 0; i < run.n; ++i) {
    ::unlink(absl::StrCat(dir, "/worker-", i, ".port").c_str());
    children[i].proc =
        cluster.Start("worker", i, WorkerCommand(cluster, run, i, hosts[i], *scheduler),
                      absl::StrCat("worker-", i, ".log"), netns[i]);
  }
  // A worker that --kill_worker kills (its trainer does, --crash_after_steps): its end is no
  // failure.
  for (const auto& [id, after] : run.kills) children[static_cast<size_t>(id)].proc->killed = true;
  std::vector<std::string> addresses(run.n);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < run.n; ++i) {
    TERN_ASSIGN_OR_RETURN(
        addresses[i], cluster.WaitForAddress(children[i].proc, absl::StrCat("worker-", i, ".port"),
                                             deadline - absl::Now(), hosts[i]));
  }
  if (!run.elastic()) {
    std::ofstream f(dir + "/peers.txt.tmp");
    for (const std::string& a : addresses) f << a << "\n";
    f.close();
    std::rename((dir + "/peers.txt.tmp").c_str(), (dir + "/peers.txt").c_str());
  }
  for (int i = 0; i < run.n; ++i)
    children[i].stub = v1::Trainer::NewStub(
        MakeChannel(addresses[i], ChannelKind::kDefault, cluster.credentials()));
  return children;
}

// A worker's steps so far, or -1 when it does not answer.
int64_t StepsOf(Child& c) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  v1::WorkerStats ws;
  if (!c.stub->Stats(&ctx, v1::StatsRequest(), &ws).ok()) return -1;
  return static_cast<int64_t>(ws.steps());
}

// What the live progress line shows between evaluations.
struct Progress {
  bool tty = false;
  absl::Time start;
  double acc = 0, loss = 0, consensus = 0, mb = 0, ratio = 1;
};

// The faults and membership changes a run injects, and how far they have come.
struct Churn {
  std::string scheduler;     // where joiners register
  std::vector<bool> killed;  // --kill_worker's, each done or not
  std::vector<bool> left;    // --leave_worker's
  size_t joined = 0;         // --join_worker's done (in step order)
};

// --kill_worker: SIGKILLs each listed worker once it has done its steps; --leave_worker: stops
// one (SIGTERM: it leaves the run); --join_worker: starts the next worker once the furthest live
// one has done the steps.
void MaybeChurn(LocalCluster& cluster, const GossipRun& run, std::vector<Child>& children,
                Churn* churn) {
  for (size_t k = 0; k < run.kills.size(); ++k) {
    // Its trainer kills it (--crash_after_steps); said here once it is gone.
    const auto [id, after] = run.kills[k];
    Child& c = children[static_cast<size_t>(id)];
    if (churn->killed[k] || c.proc->alive) continue;
    churn->killed[k] = true;
    std::fprintf(stderr, "\n[fault injection] killed worker %d after %lld steps\n", id,
                 static_cast<long long>(after));
  }
  for (size_t k = 0; k < run.leaves.size(); ++k) {
    const auto [id, after] = run.leaves[k];
    Child& c = children[static_cast<size_t>(id)];
    if (churn->left[k] || !c.proc->alive) continue;
    const int64_t steps = StepsOf(c);
    if (steps < after) continue;
    cluster.Stop(c.proc);
    churn->left[k] = true;
    std::fprintf(stderr, "\n[membership] worker %d leaves after %lld steps\n", id,
                 static_cast<long long>(steps));
  }
  if (churn->joined == run.joins.size()) return;
  int64_t furthest = -1;
  for (Child& c : children) {
    if (c.proc != nullptr && c.proc->alive) furthest = std::max(furthest, StepsOf(c));
  }
  while (churn->joined < run.joins.size() && furthest >= run.joins[churn->joined]) {
    const int id = run.n + static_cast<int>(churn->joined++);
    Child& c = children[static_cast<size_t>(id)];
    c.joined_at = furthest;
    ::unlink(absl::StrCat(cluster.dir(), "/worker-", id, ".port").c_str());
    c.proc =
        cluster.Start("worker", id, WorkerCommand(cluster, run, id, "127.0.0.1", churn->scheduler),
                      absl::StrCat("worker-", id, ".log"));
    absl::StatusOr<std::string> address =
        cluster.WaitForAddress(c.proc, absl::StrCat("worker-", id, ".port"), absl::Seconds(60));
    if (!address.ok()) {
      std::fprintf(stderr, "\n[membership] worker %d did not start: %s\n", id,
                   std::string(address.status().message()).c_str());
      continue;
    }
    c.stub =
        v1::Trainer::NewStub(MakeChannel(*address, ChannelKind::kDefault, cluster.credentials()));
    std::fprintf(stderr, "\n[membership] worker %d joins at the group's step %lld\n", id,
                 static_cast<long long>(furthest));
  }
}

void DrawLiveLine(const GossipRun& run, std::vector<Child>& children,
                  const std::vector<bool>& pending, const Progress& p) {
  int64_t at = run.total;  // the slowest pending worker's step
  for (int i = 0; i < run.max; ++i) {
    if (pending[i]) {
      const int64_t s = StepsOf(children[i]);
      if (s >= 0) at = std::min(at, s);
    }
  }
  const int64_t ep = std::min<int64_t>(run.epochs, at / run.steps_per_epoch + 1);
  std::printf(
      "\r\033[Kepoch %lld/%d [%s] round %lld/%lld | loss %.3f | acc %.2f%% | "
      "%.2f MB/worker | %.1fx vs dense | %.0fs",
      static_cast<long long>(ep), run.epochs,
      ProgressBar(static_cast<double>(at - (ep - 1) * run.steps_per_epoch) / run.steps_per_epoch)
          .c_str(),
      static_cast<long long>(at), static_cast<long long>(run.total), p.loss, 100 * p.acc, p.mb,
      p.ratio, absl::ToDoubleSeconds(absl::Now() - p.start));
  std::fflush(stdout);
}

// Every live worker's snapshot of `step` (nullopt for the ones that died first), with its
// stats; waits for the slow ones, drawing the live line and injecting the fault.
std::vector<std::optional<std::vector<float>>> CollectSnapshots(
    LocalCluster& cluster, const GossipRun& run, std::vector<Child>& children, int64_t step,
    const std::vector<ParamTensor>& layout, const CodecRegistry& codecs, Churn* churn,
    const Progress& p, std::vector<v1::WorkerStats>* stats) {
  std::vector<std::optional<std::vector<float>>> got(run.max);
  std::vector<bool> pending(run.max);
  for (int i = 0; i < run.max; ++i) {
    // A joiner started past `step` has no snapshot of it.
    pending[i] = children[i].proc != nullptr && children[i].proc->alive &&
                 (children[i].joined_at == 0 || children[i].joined_at <= step);
  }
  absl::Time last_draw = absl::InfinitePast();
  while (!cluster.interrupted()) {
    cluster.Reap();
    bool any = false;
    for (int i = 0; i < run.max; ++i) {
      if (!pending[i]) continue;
      if (!children[i].proc->alive) {
        pending[i] = false;
        continue;
      }
      bool retry = false;
      got[i] = FetchSnapshot(children[i], step, layout, codecs, &(*stats)[i], &retry);
      pending[i] = !got[i].has_value() && retry;
      any = any || pending[i];
    }
    MaybeChurn(cluster, run, children, churn);
    if (!any) break;
    if (p.tty && absl::Now() - last_draw > absl::Milliseconds(500)) {
      DrawLiveLine(run, children, pending, p);
      last_draw = absl::Now();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return got;
}

// The average of the models of the workers in `have`: what a run evaluates and keeps.
std::vector<float> Average(const std::vector<int>& have,
                           const std::vector<std::optional<std::vector<float>>>& got) {
  std::vector<double> avg(got[have[0]]->size(), 0.0);
  for (int i : have) {
    for (size_t k = 0; k < avg.size(); ++k) avg[k] += (*got[i])[k];
  }
  std::vector<float> avgf(avg.size());
  for (size_t k = 0; k < avg.size(); ++k) avgf[k] = static_cast<float>(avg[k] / have.size());
  return avgf;
}

// The metrics of the averaged model `avgf` at `step` over the workers in `have`: its test
// accuracy, how far the workers are from it, and their traffic.
v1::MetricsRow Measure(const GossipRun& run, int64_t step, std::vector<Child>& children,
                       const std::vector<int>& have,
                       const std::vector<std::optional<std::vector<float>>>& got,
                       const std::vector<float>& avgf, const std::vector<v1::WorkerStats>& stats,
                       const Model& model, const TrainTest& data, absl::Time start) {
  double consensus = 0;
  for (int i : have) {
    double d = 0;
    for (size_t k = 0; k < avgf.size(); ++k) {
      const double e = (*got[i])[k] - avgf[k];
      d += e * e;
    }
    consensus += d / have.size();
  }
  const EvalResult ev =
      model.Evaluate(avgf, data.test.features.data(), data.test.labels.data(), data.test.size());
  double loss_sum = 0, steps_done = 0, payload = 0, wire = 0, dense = 0, recv = 0;
  double compute = 0, encode = 0, wait = 0, transfer = 0, combine = 0, decode = 0, step_s = 0,
         io = 0;
  int64_t clipped = 0;
  for (int i : have) {
    const v1::WorkerStats& s = stats[i];
    loss_sum += s.loss_sum() - children[i].last.loss_sum();
    steps_done += static_cast<double>(s.steps() - children[i].last.steps());
    payload += static_cast<double>(s.payload_bytes_sent());
    wire += static_cast<double>(s.wire_bytes_sent());
    dense += static_cast<double>(s.dense_bytes_sent());
    recv += static_cast<double>(s.wire_bytes_received());
    compute += s.compute_seconds();
    encode += s.encode_seconds();
    wait += s.wait_seconds();
    transfer += s.transfer_seconds();
    combine += s.combine_seconds();
    decode += s.decode_seconds();
    step_s += s.step_seconds();
    io += s.trainer_io_seconds();
    clipped += static_cast<int64_t>(s.contributions_clipped());
    children[i].last = s;
  }
  const double k = static_cast<double>(have.size());
  v1::MetricsRow row;
  row.set_step(static_cast<int32_t>(step));
  row.set_epoch(static_cast<double>(step) / run.steps_per_epoch);
  row.set_wall_s(absl::ToDoubleSeconds(absl::Now() - start));
  row.set_workers(static_cast<int32_t>(have.size()));
  if (steps_done > 0) row.set_train_loss(loss_sum / steps_done);  // none before the first step
  row.set_test_loss(ev.loss);
  row.set_test_acc(ev.accuracy);
  row.set_consensus(consensus);
  row.set_mb_sent_per_worker(payload / k / 1e6);
  row.set_wire_mb_sent_per_worker(wire / k / 1e6);
  row.set_wire_mb_received_per_worker(recv / k / 1e6);
  row.set_dense_mb_per_worker(dense / k / 1e6);
  row.set_compression(payload > 0 ? dense / payload : 1);
  row.set_compute_s(compute / k);
  row.set_encode_s(encode / k);
  row.set_wait_s(wait / k);
  row.set_transfer_s(transfer / k);
  row.set_combine_s(combine / k);
  row.set_decode_s(decode / k);
  row.set_step_s(step_s / k);
  row.set_trainer_io_s(io / k);
  row.set_contributions_clipped(clipped);
  return row;
}

// Why a finished gossip run must not be reported as done ("" when healthy).
std::string Unhealthy(const v1::MetricsRow& last, double best_acc, int64_t evaluations,
                      double lowest_consensus) {
  const bool finite = !(last.has_train_loss() && !std::isfinite(last.train_loss())) &&
                      !(last.has_consensus() && !std::isfinite(last.consensus()));
  if (std::string why = UnhealthyRun(finite, last.test_acc(), best_acc, evaluations);
      !why.empty()) {
    return why;
  }
  return DivergedRun(last.consensus(), lowest_consensus);
}

void PrintRow(const GossipRun& run, const v1::MetricsRow& row, bool tty) {
  const int64_t step = row.step();
  const int64_t ep = step == 0 ? 0 : (step - 1) / run.steps_per_epoch + 1;
  std::printf(
      "%sepoch %lld/%d [%s] round %lld/%lld | loss %.3f | acc %.2f%% | consensus "
      "%.2e | %.2f MB/worker | %.1fx vs dense | %d workers | %.0fs\n",
      tty ? "\r\033[K" : "", static_cast<long long>(ep), run.epochs,
      ProgressBar(step == 0 ? 0
                            : static_cast<double>(step - (ep - 1) * run.steps_per_epoch) /
                                  run.steps_per_epoch)
          .c_str(),
      static_cast<long long>(step), static_cast<long long>(run.total), row.train_loss(),
      100 * row.test_acc(), row.consensus(), row.mb_sent_per_worker(), row.compression(),
      row.workers(), row.wall_s());
  std::fflush(stdout);
}

// The steps at which the averaged model is evaluated: every `every` steps, and the end (which
// absorbs a last interval shorter than half).
std::vector<int64_t> EvalSteps(const GossipRun& run) {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < run.total && run.total - s >= run.every / 2; s += run.every) {
    out.push_back(s);
  }
  out.push_back(run.total);
  return out;
}

std::string GossipRunName() {
  std::string name = absl::GetFlag(FLAGS_name);
  if (!name.empty()) return name;
  return absl::StrCat(absl::GetFlag(FLAGS_algorithm), "-",
                      absl::StrReplaceAll(absl::GetFlag(FLAGS_codec), {{":", "-"}, {",", "-"}}),
                      "-", EffectiveTopology());
}

}  // namespace

// --mode's default (empty) is a gossip run for `tern run` and federated for `tern server`.
bool IsGossipRun() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  return mode.empty() || mode == "gossip";
}

absl::Status CheckRunFlags() {
  if (!IsGossipRun()) return CheckFederatedRunFlags();
  GossipRun run;
  return CheckGossipFlags(NewBuiltinWorkerRegistries(), &run);
}

int RunCommand(const std::vector<std::string>&) {
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) {
    std::fprintf(stderr, "tern run: cannot find the tern executable (/proc/self/exe)\n");
    return 2;
  }
  return RunMain(std::string(exe, static_cast<size_t>(len)));
}

int RunMain(const std::string& self_exe) {
  if (!IsGossipRun()) return RunFederatedMain(self_exe);
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  GossipRun run;
  if (absl::Status s = CheckGossipFlags(registries, &run); !s.ok()) {
    std::fprintf(stderr, "tern run: %s\n", s.ToString().c_str());
    return 2;
  }
  EvalSetup setup;
  if (int rc = LoadEvalSetup(&setup); rc != 0) return rc;
  const TrainTest& data = setup.data;
  const Model& model = *setup.model;
  // Each worker trains on its shard of the run's size: in an elastic run, its most.
  run.steps_per_epoch = StepsPerEpoch(data.train.size(), run.max, absl::GetFlag(FLAGS_batch).value);
  run.total = CapSteps(run.steps_per_epoch * run.epochs);
  run.every = std::max<int64_t>(
      1, run.steps_per_epoch / std::max(1, absl::GetFlag(FLAGS_evals_per_epoch).value));
  const size_t train_size = data.train.size();
  setup.data.train = Dataset{};  // only the test split is needed here

  const std::string name = GossipRunName();
  const std::string dir = MakeRunDir(name);
  if (dir.empty()) return 1;
  LocalCluster cluster(self_exe, dir);
  if (absl::GetFlag(FLAGS_tls)) {
    std::vector<std::string> holders = {"scheduler"};
    for (int i = 0; i < run.max; ++i) holders.push_back(absl::StrCat("worker-", i));
    if (absl::Status s = cluster.UseTls(holders); !s.ok()) {
      std::fprintf(stderr, "tern run: --tls: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  cluster.WriteConfig(GossipConfig(name, run, data, train_size));
  std::printf("tern run: %d workers, %s, %s, codec %s, %s on %s%s; %lld steps (%lld/epoch)\n",
              run.n, absl::GetFlag(FLAGS_algorithm).c_str(), EffectiveTopology().c_str(),
              absl::GetFlag(FLAGS_codec).c_str(), absl::GetFlag(FLAGS_model).c_str(),
              data.test.source.c_str(), data.synthetic ? " (synthetic)" : "",
              static_cast<long long>(run.total), static_cast<long long>(run.steps_per_epoch));
  std::printf("run folder: %s\n", dir.c_str());
  std::fflush(stdout);

  Churn churn;
  churn.killed.resize(run.kills.size());
  churn.left.resize(run.leaves.size());
  absl::StatusOr<std::vector<Child>> children = StartWorkers(cluster, run, &churn.scheduler);
  if (!children.ok() && !cluster.interrupted()) {
    std::fprintf(stderr, "tern run: %s\n", std::string(children.status().message()).c_str());
    cluster.Finish();
    return 1;
  }
  Progress p{isatty(1) != 0, absl::Now()};
  int64_t completed_step = -1;
  double best_acc = 0;
  int64_t evaluations = 0;
  // The lowest consensus at an evaluation past the first quarter of the run, the last one aside
  // (DivergedRun).
  double lowest_consensus = std::numeric_limits<double>::infinity();
  v1::MetricsRow last;
  for (int64_t step : children.ok() ? EvalSteps(run) : std::vector<int64_t>()) {
    std::vector<v1::WorkerStats> stats(run.max);
    const auto got = CollectSnapshots(cluster, run, *children, step, model.Layout(),
                                      *registries.codecs, &churn, p, &stats);
    if (cluster.interrupted()) break;
    std::vector<int> have;
    for (int i = 0; i < run.max; ++i) {
      if (got[i].has_value()) have.push_back(i);
    }
    if (have.empty()) {
      std::fprintf(stderr, "\ntern run: no worker reached step %lld\n",
                   static_cast<long long>(step));
      break;
    }
    const std::vector<float> average = Average(have, got);
    last = Measure(run, step, *children, have, got, average, stats, model, data, p.start);
    if (step == run.total) {
      // The model the run reports on, for tern export and your own evaluation.
      absl::StatusOr<v1::TensorBundle> b = FlatToBundle(model.Layout(), average);
      absl::Status w = b.ok() ? WriteFileAtomically(dir + "/final-model.pb", b->SerializeAsString())
                              : b.status();
      if (!w.ok()) std::fprintf(stderr, "\ntern run: final model: %s\n", w.ToString().c_str());
    }
    cluster.AppendMetrics(last);
    PrintRow(run, last, p.tty);
    p.acc = last.test_acc();
    best_acc = std::max(best_acc, static_cast<double>(last.test_acc()));
    ++evaluations;
    if (4 * step >= run.total && step != run.total) {
      lowest_consensus = std::min(lowest_consensus, static_cast<double>(last.consensus()));
    }
    p.loss = last.train_loss();
    p.consensus = last.consensus();
    p.mb = last.mb_sent_per_worker();
    p.ratio = last.compression();
    completed_step = step;
  }
  const bool interrupted = cluster.interrupted();
  const std::vector<std::string> failed = cluster.Failures();
  cluster.Finish();
  if (interrupted) {
    std::printf("\ninterrupted; partial results in %s\n", dir.c_str());
    return 130;
  }
  if (!failed.empty()) {
    std::printf("run failed: %s; see %s/worker-*.log\n", absl::StrJoin(failed, "; ").c_str(),
                dir.c_str());
    return 1;
  }
  if (completed_step != run.total) {
    std::printf("run did not finish (last evaluation at step %lld); see %s/worker-*.log\n",
                static_cast<long long>(completed_step), dir.c_str());
    return 1;
  }
  if (std::string why = Unhealthy(last, best_acc, evaluations, lowest_consensus); !why.empty()) {
    std::printf("run failed: %s; see %s/worker-*.log and docs/robustness.md\n", why.c_str(),
                dir.c_str());
    return 1;
  }
  std::printf(
      "done: test accuracy %.2f%%, consensus %.2e, %.2f MB sent per worker (%.1fx less "
      "than dense)\nreport: %s/report.html\n",
      100 * last.test_acc(), last.consensus(), last.mb_sent_per_worker(), last.compression(),
      dir.c_str());
  return 0;
}

}  // namespace tern
