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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "cli/process.h"
#include "cli/report.h"
#include "cli/train_flags.h"
#include "clients/cpp/builtin_trainer.h"
#include "common/json_lines.h"
#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/status.h"
#include "core/workload/builtin_model.h"
#include "core/workload/dataset.h"
#include "core/workload/partition.h"
#include "grpcpp/grpcpp.h"
#include "kernels/builtin.h"
#include "tern/v1/records.pb.h"
#include "tern/v1/worker.grpc.pb.h"

ABSL_DECLARE_FLAG(int, workers);
ABSL_DECLARE_FLAG(int, epochs);
ABSL_DECLARE_FLAG(int, batch);
ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, algorithm);
ABSL_DECLARE_FLAG(std::string, codec);
ABSL_DECLARE_FLAG(std::string, topology);
ABSL_DECLARE_FLAG(std::string, partition);
ABSL_DECLARE_FLAG(double, lr);
ABSL_DECLARE_FLAG(std::string, lr_schedule);
ABSL_DECLARE_FLAG(double, round_timeout);
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, mode);

ABSL_FLAG(int, evals_per_epoch, 2, "run: evaluations of the averaged model per epoch");
ABSL_FLAG(std::string, name, "", "run: run name (default <algorithm>-<codec>-<topology>)");
ABSL_FLAG(std::string, kill_worker, "",
          "run: fault injection, ID@STEP: SIGKILL worker ID once it has done STEP steps");

namespace tern {
namespace {

struct Child {
  ChildProcess proc;
  std::unique_ptr<v1::Trainer::Stub> stub;
  v1::WorkerStats last;  // stats at the previous evaluation
};

std::vector<ChildProcess*> Procs(std::vector<Child>& children) {
  std::vector<ChildProcess*> out;
  for (Child& c : children) out.push_back(&c.proc);
  return out;
}

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
    if (!*retry)
      std::fprintf(stderr, "\nworker %d: snapshot %lld: %s\n", c.proc.id,
                   static_cast<long long>(step), gs.error_message().c_str());
    return std::nullopt;
  }
  if (!bundle.ok()) return std::nullopt;
  *stats = first.stats();
  std::vector<float> x(LayoutNumel(layout));
  if (!BundleToFlat(*bundle, layout, codecs, absl::MakeSpan(x)).ok()) return std::nullopt;
  return x;
}

}  // namespace

int RunMain(const std::string& self_exe) {
  if (absl::GetFlag(FLAGS_mode) != "gossip") return RunFederatedMain(self_exe);
  const int n = absl::GetFlag(FLAGS_workers);
  const int epochs = absl::GetFlag(FLAGS_epochs);
  const int evals = std::max(1, absl::GetFlag(FLAGS_evals_per_epoch));
  if (n < 1 || n > 256 || epochs < 1) {
    std::fprintf(stderr, "tern run: need 1 <= --workers <= 256 and --epochs >= 1\n");
    return 2;
  }
  // Check the configuration here, so a typo fails before any process starts.
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  const CodecRegistry* codecs = registries.codecs.get();
  {
    auto eo = EngineOptionsFromFlags(0, n, 1, 1);
    absl::Status s = eo.status();
    if (s.ok()) s = RoundEngine::Create(*eo, &registries, nullptr).status();
    // What the workers' built-in trainers check at their start, checked here instead.
    if (s.ok()) {
      if (absl::Status p = ParsePartition(absl::GetFlag(FLAGS_partition)).status(); !p.ok()) {
        s = absl::InvalidArgumentError(
            absl::StrCat("--partition=", absl::GetFlag(FLAGS_partition), ": ", p.message()));
      }
    }
    if (!s.ok()) {
      std::fprintf(stderr, "tern run: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  int kill_id = -1;
  int64_t kill_step = 0;
  if (const std::string k = absl::GetFlag(FLAGS_kill_worker); !k.empty()) {
    std::vector<std::string> p = absl::StrSplit(k, '@');
    if (p.size() != 2 || !absl::SimpleAtoi(p[0], &kill_id) || !absl::SimpleAtoi(p[1], &kill_step) ||
        kill_id < 0 || kill_id >= n) {
      std::fprintf(stderr, "tern run: --kill_worker wants ID@STEP with ID < %d\n", n);
      return 2;
    }
  }

  EvalSetup setup;
  if (int rc = LoadEvalSetup(&setup); rc != 0) return rc;
  TrainTest* const data = &setup.data;
  std::unique_ptr<Model>* const model = &setup.model;
  const int64_t steps_per_epoch = StepsPerEpoch(data->train.size(), n, absl::GetFlag(FLAGS_batch));
  const int64_t total = steps_per_epoch * epochs;
  const int64_t every = std::max<int64_t>(1, steps_per_epoch / evals);
  const size_t train_size = data->train.size();
  data->train = Dataset{};  // only the test split is needed here

  std::string name = absl::GetFlag(FLAGS_name);
  if (name.empty()) {
    name = absl::StrCat(absl::GetFlag(FLAGS_algorithm), "-",
                        absl::StrReplaceAll(absl::GetFlag(FLAGS_codec), {{":", "-"}, {",", "-"}}),
                        "-", absl::GetFlag(FLAGS_topology));
  }
  const std::string dir = MakeRunDir(name);
  if (dir.empty()) return 1;
  ::unlink((dir + "/peers.txt").c_str());
  {
    v1::RunConfig c;
    c.set_name(name);
    c.set_mode("gossip");
    c.set_algorithm(absl::GetFlag(FLAGS_algorithm));
    c.set_codec(absl::GetFlag(FLAGS_codec));
    c.set_topology(absl::GetFlag(FLAGS_topology));
    c.set_model(absl::GetFlag(FLAGS_model));
    c.set_partition(absl::GetFlag(FLAGS_partition));
    c.set_lr_schedule(absl::GetFlag(FLAGS_lr_schedule));
    c.set_data(data->test.source);
    c.set_workers(n);
    c.set_epochs(epochs);
    c.set_batch(absl::GetFlag(FLAGS_batch));
    c.set_lr(EffectiveLr());
    c.set_seed(static_cast<double>(absl::GetFlag(FLAGS_seed)));
    c.set_steps_per_epoch(static_cast<int32_t>(steps_per_epoch));
    c.set_total_steps(static_cast<int32_t>(total));
    c.set_train_examples(static_cast<int32_t>(train_size));
    c.set_synthetic(data->synthetic);
    std::ofstream(dir + "/run.json") << ToJsonLine(c);
  }

  const volatile sig_atomic_t* const interrupted_flag = CatchInterrupts();

  std::printf("tern run: %d workers, %s, %s, codec %s, %s on %s%s; %lld steps (%lld/epoch)\n", n,
              absl::GetFlag(FLAGS_algorithm).c_str(), absl::GetFlag(FLAGS_topology).c_str(),
              absl::GetFlag(FLAGS_codec).c_str(), absl::GetFlag(FLAGS_model).c_str(),
              data->test.source.c_str(), data->synthetic ? " (synthetic)" : "",
              static_cast<long long>(total), static_cast<long long>(steps_per_epoch));
  std::printf("run folder: %s\n", dir.c_str());
  std::fflush(stdout);

  std::vector<Child> children(n);
  for (int i = 0; i < n; ++i) {
    Child& c = children[i];
    c.proc.id = i;
    c.proc.log = absl::StrCat(dir, "/worker-", i, ".log");
    std::vector<std::string> args = {
        "worker",
        absl::StrCat("--id=", i),
        absl::StrCat("--workers=", n),
        "--listen=127.0.0.1:0",
        absl::StrCat("--port_file=", dir, "/worker-", i, ".port"),
        absl::StrCat("--peers_file=", dir, "/peers.txt"),
        absl::StrCat("--snapshot_every=", every),
        absl::StrCat("--total_steps=", total),
        absl::StrCat("--round_log=", dir, "/worker-", i, ".steps.jsonl"),
        absl::StrCat("--log_level=", absl::GetFlag(FLAGS_log_level))};
    for (std::string& a : SharedTrainFlagArgs()) args.push_back(std::move(a));
    ::unlink((dir + absl::StrCat("/worker-", i, ".port")).c_str());
    c.proc.pid = Spawn(self_exe, args, c.proc.log);
    c.proc.alive = c.proc.pid > 0;
  }
  // Collect the ports, then tell everyone where everyone is.
  std::vector<std::string> addresses(n);
  const absl::Time port_deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < n; ++i) {
    const int port =
        WaitForPortFile(absl::StrCat(dir, "/worker-", i, ".port"), children[i].proc,
                        absl::ToDoubleSeconds(port_deadline - absl::Now()), interrupted_flag);
    if (*interrupted_flag) break;
    if (port == 0) {
      std::fprintf(stderr, "tern run: worker %d did not start; its log:\n%s\n", i,
                   Tail(children[i].proc.log).c_str());
      StopAll(Procs(children));
      return 1;
    }
    addresses[i] = absl::StrCat("127.0.0.1:", port);
  }
  {
    std::ofstream f(dir + "/peers.txt.tmp");
    for (const std::string& a : addresses) f << a << "\n";
  }
  std::rename((dir + "/peers.txt.tmp").c_str(), (dir + "/peers.txt").c_str());
  for (int i = 0; i < n; ++i) {
    children[i].stub = v1::Trainer::NewStub(MakeChannel(addresses[i]));
  }

  const std::vector<ParamTensor>& layout = (*model)->Layout();
  std::vector<int64_t> eval_steps;
  // Every `every` steps, and the end (which absorbs a last interval shorter than half).
  for (int64_t s = 0; s < total && total - s >= every / 2; s += every) eval_steps.push_back(s);
  eval_steps.push_back(total);

  std::ofstream metrics(dir + "/metrics.jsonl");
  const bool tty = isatty(1);
  const absl::Time start = absl::Now();
  bool killed = false;
  double last_acc = 0, last_loss = 0, last_consensus = 0, last_mb = 0, last_ratio = 1;
  int64_t completed_step = -1;
  for (int64_t step : eval_steps) {
    std::vector<std::optional<std::vector<float>>> got(n);
    std::vector<v1::WorkerStats> stats(n);
    std::vector<bool> pending(n);
    for (int i = 0; i < n; ++i) pending[i] = children[i].proc.alive;
    absl::Time last_draw = absl::InfinitePast();
    while (!*interrupted_flag) {
      Reap(Procs(children));
      bool any = false;
      for (int i = 0; i < n; ++i) {
        if (!pending[i]) continue;
        if (!children[i].proc.alive) {
          pending[i] = false;
          continue;
        }
        bool retry = false;
        got[i] = FetchSnapshot(children[i], step, layout, *codecs, &stats[i], &retry);
        pending[i] = !got[i].has_value() && retry;
        any = any || pending[i];
      }
      if (kill_id >= 0 && !killed && children[kill_id].proc.alive) {
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
        v1::WorkerStats ws;
        if (children[kill_id].stub->Stats(&ctx, v1::StatsRequest(), &ws).ok() &&
            static_cast<int64_t>(ws.steps()) >= kill_step) {
          kill(children[kill_id].proc.pid, SIGKILL);
          killed = true;
          std::fprintf(stderr, "\n[fault injection] killed worker %d after %llu steps\n", kill_id,
                       static_cast<unsigned long long>(ws.steps()));
        }
      }
      if (!any) break;
      if (tty && absl::Now() - last_draw > absl::Milliseconds(500)) {
        // Live line between evaluations: the slowest pending worker's step.
        int64_t at = total;
        for (int i = 0; i < n; ++i) {
          if (!pending[i]) continue;
          grpc::ClientContext ctx;
          ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
          v1::WorkerStats ws;
          if (children[i].stub->Stats(&ctx, v1::StatsRequest(), &ws).ok()) {
            at = std::min<int64_t>(at, static_cast<int64_t>(ws.steps()));
          }
        }
        const int64_t ep = std::min<int64_t>(epochs, at / steps_per_epoch + 1);
        std::printf(
            "\r\033[Kepoch %lld/%d [%s] round %lld/%lld | loss %.3f | acc %.2f%% | "
            "%.2f MB/worker | %.1fx vs dense | %.0fs",
            static_cast<long long>(ep), epochs,
            ProgressBar(static_cast<double>(at - (ep - 1) * steps_per_epoch) / steps_per_epoch)
                .c_str(),
            static_cast<long long>(at), static_cast<long long>(total), last_loss, 100 * last_acc,
            last_mb, last_ratio, absl::ToDoubleSeconds(absl::Now() - start));
        std::fflush(stdout);
        last_draw = absl::Now();
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    if (*interrupted_flag) break;
    // The averaged model, its test accuracy, and how far the workers are from it.
    std::vector<int> have;
    for (int i = 0; i < n; ++i) {
      if (got[i].has_value()) have.push_back(i);
    }
    if (have.empty()) {
      std::fprintf(stderr, "\ntern run: no worker reached step %lld\n",
                   static_cast<long long>(step));
      break;
    }
    std::vector<double> avg(LayoutNumel(layout), 0.0);
    for (int i : have) {
      for (size_t k = 0; k < avg.size(); ++k) avg[k] += (*got[i])[k];
    }
    std::vector<float> avgf(avg.size());
    for (size_t k = 0; k < avg.size(); ++k) avgf[k] = static_cast<float>(avg[k] / have.size());
    double consensus = 0;
    for (int i : have) {
      double d = 0;
      for (size_t k = 0; k < avgf.size(); ++k) {
        const double e = (*got[i])[k] - avgf[k];
        d += e * e;
      }
      consensus += d / have.size();
    }
    EvalResult ev = (*model)->Evaluate(avgf, data->test.features.data(), data->test.labels.data(),
                                       data->test.size());
    double loss_sum = 0, steps_done = 0, payload = 0, wire = 0, dense = 0, recv = 0;
    double compute = 0, encode = 0, wait = 0, transfer = 0;
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
      children[i].last = s;
    }
    const double k = static_cast<double>(have.size());
    const double train_loss = steps_done > 0 ? loss_sum / steps_done : 0;
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);
    last_acc = ev.accuracy;
    last_loss = train_loss;
    last_consensus = consensus;
    last_mb = payload / k / 1e6;
    last_ratio = payload > 0 ? dense / payload : 1;
    completed_step = step;
    v1::MetricsRow row;
    row.set_step(static_cast<int32_t>(step));
    row.set_epoch(static_cast<double>(step) / steps_per_epoch);
    row.set_wall_s(wall);
    row.set_workers(static_cast<int32_t>(have.size()));
    if (steps_done > 0) row.set_train_loss(train_loss);  // no loss before the first step
    row.set_test_loss(ev.loss);
    row.set_test_acc(ev.accuracy);
    row.set_consensus(consensus);
    row.set_mb_sent_per_worker(payload / k / 1e6);
    row.set_wire_mb_sent_per_worker(wire / k / 1e6);
    row.set_wire_mb_received_per_worker(recv / k / 1e6);
    row.set_dense_mb_per_worker(dense / k / 1e6);
    row.set_compression(last_ratio);
    row.set_compute_s(compute / k);
    row.set_encode_s(encode / k);
    row.set_wait_s(wait / k);
    row.set_transfer_s(transfer / k);
    metrics << ToJsonLine(row);
    metrics.flush();
    const int64_t ep = step == 0 ? 0 : (step - 1) / steps_per_epoch + 1;
    std::printf(
        "%sepoch %lld/%d [%s] round %lld/%lld | loss %.3f | acc %.2f%% | consensus "
        "%.2e | %.2f MB/worker | %.1fx vs dense | %d workers | %.0fs\n",
        tty ? "\r\033[K" : "", static_cast<long long>(ep), epochs,
        ProgressBar(step == 0
                        ? 0
                        : static_cast<double>(step - (ep - 1) * steps_per_epoch) / steps_per_epoch)
            .c_str(),
        static_cast<long long>(step), static_cast<long long>(total), train_loss, 100 * ev.accuracy,
        consensus, last_mb, last_ratio, static_cast<int>(have.size()), wall);
    std::fflush(stdout);
  }
  const bool interrupted = *interrupted_flag != 0;
  StopAll(Procs(children));
  metrics.close();
  auto run = LoadRun(dir);
  if (run.ok()) {
    std::ofstream(dir + "/report.html") << RenderReport({*run});
  }
  if (interrupted) {
    std::printf("\ninterrupted; partial results in %s\n", dir.c_str());
    return 130;
  }
  if (completed_step != total) {
    std::printf("run did not finish (last evaluation at step %lld); see %s/worker-*.log\n",
                static_cast<long long>(completed_step), dir.c_str());
    return 1;
  }
  std::printf(
      "done: test accuracy %.2f%%, consensus %.2e, %.2f MB sent per worker (%.1fx less "
      "than dense)\nreport: %s/report.html\n",
      100 * last_acc, last_consensus, last_mb, last_ratio, dir.c_str());
  return 0;
}

}  // namespace tern
