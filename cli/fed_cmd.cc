// `tern server` (the aggregator daemon), `tern client` (built-in clients of an aggregator, many
// simulated clients per process) and `tern run --mode federated|local-sgd|ps` (a server plus N
// clients as processes on 127.0.0.1, with the same progress line, metrics.jsonl and report as
// gossip runs).
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "cli/process.h"
#include "cli/report.h"
#include "cli/train_flags.h"
#include "clients/cpp/fed_client.h"
#include "common/json_lines.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/status.h"
#include "core/workload/builtin_model.h"
#include "core/workload/dataset.h"
#include "grpcpp/grpcpp.h"
#include "kernels/builtin.h"
#include "server/service.h"
#include "spdlog/spdlog.h"
#include "tern/v1/records.pb.h"
#include "tern/v1/server.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(std::string, run_id);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(std::string, partition);
ABSL_DECLARE_FLAG(int, batch);
ABSL_DECLARE_FLAG(double, lr);
ABSL_DECLARE_FLAG(int, local_steps);
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, name);

ABSL_FLAG(std::string, mode, "gossip",
          "run: gossip (peer workers) | federated | local-sgd | ps (a server and clients); "
          "server: federated | local-sgd | ps");
ABSL_FLAG(int, clients, 100, "run/client: clients (run: in all; client: in this process)");
ABSL_FLAG(int, clients_per_process, 25, "run: simulated clients per client process");
ABSL_FLAG(int, first_client, 0, "client: data partition of this process's first client");
ABSL_FLAG(int, partitions, 0, "client: partitions the data is split into (0: --clients)");
ABSL_FLAG(std::string, server, "", "client: the aggregator's host:port");
ABSL_FLAG(int, rounds, 50, "server/run: rounds of the run");
ABSL_FLAG(int, clients_per_round, 10, "server/run: K, clients sampled per federated round");
ABSL_FLAG(int, min_clients, 0,
          "server/run: clients that must have joined before round 1 (0: all of --clients in a "
          "run, 1 for a bare server)");
ABSL_FLAG(int, min_replies, 0, "server/run: a round may close after this many replies (0: K)");
ABSL_FLAG(double, grace_s, 1, "server/run: seconds a round stays open after its min replies");
ABSL_FLAG(double, round_deadline_s, 60, "server/run: seconds after which a round closes");
ABSL_FLAG(double, staleness_decay, 0,
          "server/run: late updates keep weight decay^age (0: late updates are dropped)");
ABSL_FLAG(int, max_staleness, 2, "server/run: oldest round (in rounds) a late update may be for");
ABSL_FLAG(std::string, sampling, "uniform", "server/run: client sampling: uniform | score");
ABSL_FLAG(std::string, rule, "fedavg",
          "server/run: fedavg | median | trimmed-mean:trim=T | krum:f=F | multi-krum:f=F,m=M, "
          "any with ,clip=C");
ABSL_FLAG(double, server_lr, 1.0, "server/run: outer learning rate (x += server_lr * m)");
ABSL_FLAG(double, server_momentum, 0.0,
          "server/run: outer momentum (SlowMo's beta; 0: plain FedAvg / local SGD)");
ABSL_FLAG(std::string, downstream, "model",
          "server/run: model (send the global model each round) | delta (send each round's "
          "global update, encoded with --downstream_codec and a server residual; clients that "
          "missed rounds catch up from the kept updates)");
ABSL_FLAG(std::string, downstream_codec, "none",
          "server/run: codec of what goes to clients (the model, or the update with "
          "--downstream=delta)");
ABSL_FLAG(std::string, update_codec, "none", "server/run: codec clients encode updates with");
ABSL_FLAG(bool, error_feedback, false, "server/run: clients keep their update codec's residual");
ABSL_FLAG(std::string, memory, "",
          "server/run: clients' memory around the update codec: ef | "
          "dgc[:ratio=R,momentum=M,clip=C,warmup=E,exact=B] (Deep Gradient Compression; replaces "
          "--update_codec)");
ABSL_FLAG(int, local_epochs, 1,
          "server/run: local epochs per round (0: --local_steps minibatch steps instead)");
ABSL_FLAG(double, local_momentum, 0.0, "server/run: clients' local SGD momentum");
ABSL_FLAG(
    std::string, optimizer, "sgd",
    "server/run (ps): sgd (with --server_momentum) | adam | lamb | onebit-adam | onebit-lamb");
ABSL_FLAG(int, warmup_rounds, 100,
          "server/run: 1-bit Adam/LAMB's dense warm-up rounds, after which the variance freezes");
ABSL_FLAG(double, adaptive_batch_eta, 0,
          "server/run: clients' norm test (adaptive batch size for local work): raise the batch "
          "while Var/b > eta^2 ||g||^2 (0: off)");
ABSL_FLAG(double, overlap_anchor, 0,
          "server/run, mode local-sgd: Overlap-Local-SGD's pull alpha (clients keep their own "
          "models, run the next local steps while the anchor is averaged, then pull "
          "x -= alpha (x - anchor)); 0: plain local SGD");
ABSL_FLAG(int, max_batch, 1024, "server/run: the adaptive batch size's cap");
ABSL_FLAG(double, beta1, 0.9, "server/run: Adam's first-moment decay");
ABSL_FLAG(double, beta2, 0.999, "server/run: Adam's second-moment decay");
ABSL_FLAG(double, eps, 1e-8, "server/run: Adam's epsilon");
ABSL_FLAG(double, client_timeout_s, 30, "server: a client silent this long is not sampled");
ABSL_FLAG(std::string, checkpoint, "", "server: checkpoint file (resumed from when present)");
ABSL_FLAG(double, linger_s, 10, "server: seconds to keep serving after the last round");
ABSL_FLAG(std::string, kill_server_at_round, "",
          "run: fault injection, R: SIGKILL the server once round R closed, then restart it");
ABSL_FLAG(std::string, kill_client_at_round, "",
          "run: fault injection, G@R: SIGKILL client process G once round R closed");

namespace tern {
namespace {

double FedLr() {
  const double lr = absl::GetFlag(FLAGS_lr);
  return lr > 0 ? lr : 0.05;
}

// The task's work for `mode` from the flags: a gradient step (ps) or local training. A flag
// of the other kind of work is an error rather than silently ignored.
absl::Status SetTaskWork(const std::string& mode, v1::Task* task) {
  const uint32_t batch = static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_batch)));
  const std::string& optimizer = absl::GetFlag(FLAGS_optimizer);
  if (mode == "ps") {
    if (absl::GetFlag(FLAGS_adaptive_batch_eta) > 0) {
      return absl::InvalidArgumentError(
          "--adaptive_batch_eta is for local work, not --mode=ps (one minibatch a round)");
    }
    v1::GradientStep* g = task->mutable_gradient();
    g->set_batch(batch);
    g->set_lr(static_cast<float>(FedLr()));
    g->set_optimizer(optimizer);
    g->set_warmup_rounds(static_cast<uint64_t>(std::max(0, absl::GetFlag(FLAGS_warmup_rounds))));
    g->set_beta1(static_cast<float>(absl::GetFlag(FLAGS_beta1)));
    g->set_eps(static_cast<float>(absl::GetFlag(FLAGS_eps)));
    return absl::OkStatus();
  }
  if (!optimizer.empty() && optimizer != "sgd") {
    return absl::InvalidArgumentError(absl::StrCat("--optimizer=", optimizer, " needs --mode=ps"));
  }
  v1::LocalTraining* l = task->mutable_local();
  l->set_local_epochs(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_local_epochs))));
  l->set_local_steps(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_local_steps))));
  l->set_batch(batch);
  l->set_lr(static_cast<float>(FedLr()));
  l->set_momentum(static_cast<float>(absl::GetFlag(FLAGS_local_momentum)));
  l->set_norm_test_eta(static_cast<float>(absl::GetFlag(FLAGS_adaptive_batch_eta)));
  l->set_max_batch(static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_max_batch))));
  l->set_anchor_pull(static_cast<float>(absl::GetFlag(FLAGS_overlap_anchor)));
  return absl::OkStatus();
}

absl::StatusOr<ServerOptions> ServerOptionsFromFlags() {
  ServerOptions so;
  so.listen = absl::GetFlag(FLAGS_listen);
  AggregatorOptions& a = so.aggregator;
  a.run_id = absl::GetFlag(FLAGS_run_id);
  a.mode = absl::GetFlag(FLAGS_mode) == "gossip" ? "federated" : absl::GetFlag(FLAGS_mode);
  a.min_clients = std::max(1, absl::GetFlag(FLAGS_min_clients));
  a.total_rounds = absl::GetFlag(FLAGS_rounds);
  a.policy.clients_per_round = absl::GetFlag(FLAGS_clients_per_round);
  a.policy.min_replies = absl::GetFlag(FLAGS_min_replies) > 0 ? absl::GetFlag(FLAGS_min_replies)
                                                              : a.policy.clients_per_round;
  a.policy.grace = absl::Seconds(absl::GetFlag(FLAGS_grace_s));
  a.policy.deadline = absl::Seconds(absl::GetFlag(FLAGS_round_deadline_s));
  a.policy.staleness_decay = absl::GetFlag(FLAGS_staleness_decay);
  a.policy.max_staleness = absl::GetFlag(FLAGS_max_staleness);
  auto sampling = ParseSampling(absl::GetFlag(FLAGS_sampling));
  if (!sampling.ok()) return sampling.status();
  a.policy.sampling = *sampling;
  a.policy.seed = absl::GetFlag(FLAGS_seed);
  a.rule = absl::GetFlag(FLAGS_rule);
  a.server_lr = absl::GetFlag(FLAGS_server_lr);
  a.server_momentum = absl::GetFlag(FLAGS_server_momentum);
  a.downstream = absl::GetFlag(FLAGS_downstream);
  a.downstream_codec = absl::GetFlag(FLAGS_downstream_codec);
  a.task.set_update_codec(absl::GetFlag(FLAGS_update_codec));
  a.task.set_error_feedback(absl::GetFlag(FLAGS_error_feedback));
  a.task.set_memory(absl::GetFlag(FLAGS_memory));
  a.task.set_seed(absl::GetFlag(FLAGS_seed));
  TERN_RETURN_IF_ERROR(SetTaskWork(a.mode, &a.task));
  a.beta2 = static_cast<float>(absl::GetFlag(FLAGS_beta2));
  a.client_timeout = absl::Seconds(absl::GetFlag(FLAGS_client_timeout_s));
  a.checkpoint_path = absl::GetFlag(FLAGS_checkpoint);
  return so;
}

}  // namespace

int ServerMain() {
  sigset_t signals = BlockStopSignals();
  auto options = ServerOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "tern server: %s\n", options.status().ToString().c_str());
    return 2;
  }
  const ServerRegistries registries = NewBuiltinServerRegistries();
  auto server = AggregatorServer::Start(*options, &registries);
  if (!server.ok()) {
    std::fprintf(stderr, "tern server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const v1::ServerStatus st = (*server)->aggregator().Status(absl::Now());
  spdlog::info("server: serving run '{}' ({}, rule {}) on port {}; round {}/{}{}",
               options->aggregator.run_id, options->aggregator.mode, options->aggregator.rule,
               (*server)->port(), st.round(), st.total_rounds(),
               st.restarts() > 0 ? " (resumed from the checkpoint)" : "");
  WritePortFile(absl::GetFlag(FLAGS_port_file), (*server)->port());
  // The last round's close raises SIGUSR1 after the linger (so clients hear DONE and the final
  // model can be fetched), unless a signal came first.
  absl::Notification quit;
  std::thread waiter([&] {
    (*server)->WaitDone();
    if (!quit.WaitForNotificationWithTimeout(absl::Seconds(absl::GetFlag(FLAGS_linger_s)))) {
      kill(getpid(), SIGUSR1);
    }
  });
  int sig = 0;
  sigwait(&signals, &sig);
  quit.Notify();
  spdlog::info("server: {}, shutting down", sig == SIGUSR1 ? "run finished" : strsignal(sig));
  const absl::Time t0 = absl::Now();
  (*server)->Shutdown(absl::Seconds(5));
  waiter.join();
  spdlog::info("server: stopped in {:.2f} s", absl::ToDoubleSeconds(absl::Now() - t0));
  return 0;
}

int ClientMain() {
  sigset_t signals = BlockStopSignals();
  const int n = absl::GetFlag(FLAGS_clients);
  const int first = absl::GetFlag(FLAGS_first_client);
  const int parts = absl::GetFlag(FLAGS_partitions) > 0 ? absl::GetFlag(FLAGS_partitions) : n;
  if (n < 1 || first < 0 || first + n > parts || absl::GetFlag(FLAGS_server).empty()) {
    std::fprintf(stderr,
                 "tern client: need --server, --clients >= 1 and first_client + clients <= "
                 "partitions\n");
    return 2;
  }
  auto shared = LoadFedClientData(absl::GetFlag(FLAGS_data), absl::GetFlag(FLAGS_partition), parts,
                                  absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_seed));
  if (!shared.ok()) {
    std::fprintf(stderr, "tern client: %s\n", shared.status().ToString().c_str());
    return 1;
  }
  auto channel = MakeChannel(absl::GetFlag(FLAGS_server));
  std::atomic<bool> stop{false};
  std::atomic<int> failed{0}, finished{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      FedClientOptions o;
      o.run_id = absl::GetFlag(FLAGS_run_id);
      o.server = absl::GetFlag(FLAGS_server);
      o.index = first + i;
      o.seed = absl::GetFlag(FLAGS_seed);
      auto r = RunFederatedClient(channel, o, **shared, stop);
      if (!r.ok() && !stop.load()) {
        spdlog::error("client-{}: {}", o.index, r.status().ToString());
        ++failed;
      } else if (r.ok()) {
        spdlog::debug("client-{}: {} rounds trained, {} updates accepted, {} not used", o.index,
                      r->rounds_trained, r->updates_accepted, r->updates_refused);
      }
      if (++finished == n) kill(getpid(), SIGUSR1);
    });
  }
  spdlog::info("clients {}..{} of {} ({} examples each on average) talking to {}", first,
               first + n - 1, parts, (*shared)->data.train.size() / parts,
               absl::GetFlag(FLAGS_server));
  int sig = 0;
  sigwait(&signals, &sig);
  stop = true;
  for (std::thread& t : threads) t.join();
  spdlog::info("clients {}..{}: {}", first, first + n - 1,
               sig == SIGUSR1 ? "run finished" : strsignal(sig));
  return failed.load() > 0 ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// tern run --mode federated|local-sgd|ps

namespace {

std::optional<std::vector<float>> FetchGlobalModel(v1::Aggregator::Stub& stub, int64_t round,
                                                   const std::vector<ParamTensor>& layout,
                                                   const CodecRegistry& codecs,
                                                   v1::ServerStatus* status) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::GetModelRequest req;
  req.set_round(static_cast<uint64_t>(round));
  auto reader = stub.GetModel(&ctx, req);
  v1::GetModelReply first;
  absl::StatusOr<v1::TensorBundle> bundle = ReadChunkedBundle(reader.get(), &first);
  if (!reader->Finish().ok() || !bundle.ok()) return std::nullopt;
  *status = first.status();
  std::vector<float> x(LayoutNumel(layout));
  if (!BundleToFlat(*bundle, layout, codecs, absl::MakeSpan(x)).ok()) return std::nullopt;
  return x;
}

}  // namespace

int RunFederatedMain(const std::string& self_exe) {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const int n = absl::GetFlag(FLAGS_clients);
  const int per = std::max(1, absl::GetFlag(FLAGS_clients_per_process));
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (n < 1 || n > 10000 || rounds < 1) {
    std::fprintf(stderr, "tern run: need 1 <= --clients <= 10000 and --rounds >= 1\n");
    return 2;
  }
  const ServerRegistries registries = NewBuiltinServerRegistries();
  const CodecRegistry* codecs = registries.codecs.get();
  {
    auto so = ServerOptionsFromFlags();
    absl::Status s = so.status();
    if (s.ok()) s = NormalizeAggregatorOptions(so->aggregator, *codecs).status();
    if (s.ok()) s = registries.rules->Create(so->aggregator.rule).status();
    if (!s.ok()) {
      std::fprintf(stderr, "tern run: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  int kill_server_round = -1, kill_group = -1, kill_client_round = -1;
  if (const std::string k = absl::GetFlag(FLAGS_kill_server_at_round); !k.empty()) {
    if (!absl::SimpleAtoi(k, &kill_server_round) || kill_server_round < 1 ||
        kill_server_round >= rounds) {
      std::fprintf(stderr, "tern run: --kill_server_at_round wants R in [1, rounds)\n");
      return 2;
    }
  }
  if (const std::string k = absl::GetFlag(FLAGS_kill_client_at_round); !k.empty()) {
    const size_t at = k.find('@');
    if (at == std::string::npos || !absl::SimpleAtoi(k.substr(0, at), &kill_group) ||
        !absl::SimpleAtoi(k.substr(at + 1), &kill_client_round) || kill_group < 0 ||
        kill_group >= (n + per - 1) / per || kill_client_round < 1) {
      std::fprintf(stderr, "tern run: --kill_client_at_round wants G@R with G < %d\n",
                   (n + per - 1) / per);
      return 2;
    }
  }
  EvalSetup setup;
  if (int rc = LoadEvalSetup(&setup); rc != 0) return rc;
  TrainTest* const data = &setup.data;
  std::unique_ptr<Model>* const model = &setup.model;
  data->train = Dataset{};

  std::string name = absl::GetFlag(FLAGS_name);
  if (name.empty()) {
    const std::string what = absl::GetFlag(FLAGS_memory).rfind("dgc", 0) == 0
                                 ? absl::GetFlag(FLAGS_memory)
                                 : absl::GetFlag(FLAGS_update_codec);
    name = absl::StrCat(mode, "-", absl::StrReplaceAll(what, {{":", "-"}, {",", "-"}, {"=", ""}}),
                        "-", n, "clients");
    if (absl::GetFlag(FLAGS_overlap_anchor) > 0) name = absl::StrCat("overlap-", name);
  }
  const std::string dir = MakeRunDir(name);
  if (dir.empty()) return 1;
  const int k = mode == "federated" ? std::min(n, absl::GetFlag(FLAGS_clients_per_round)) : n;
  {
    v1::RunConfig c;
    c.set_name(name);
    c.set_mode(mode);
    c.set_algorithm(mode);
    c.set_codec(absl::GetFlag(FLAGS_update_codec));
    c.set_topology("server");
    c.set_rule(absl::GetFlag(FLAGS_rule));
    c.set_model(absl::GetFlag(FLAGS_model));
    c.set_partition(absl::GetFlag(FLAGS_partition));
    c.set_data(data->test.source);
    c.set_workers(n);
    c.set_clients_per_round(k);
    c.set_rounds(rounds);
    c.set_local_epochs(absl::GetFlag(FLAGS_local_epochs));
    c.set_local_steps(absl::GetFlag(FLAGS_local_steps));
    c.set_batch(absl::GetFlag(FLAGS_batch));
    c.set_lr(FedLr());
    c.set_server_lr(absl::GetFlag(FLAGS_server_lr));
    c.set_server_momentum(absl::GetFlag(FLAGS_server_momentum));
    c.set_downstream(absl::GetFlag(FLAGS_downstream));
    c.set_downstream_codec(absl::GetFlag(FLAGS_downstream_codec));
    c.set_seed(static_cast<double>(absl::GetFlag(FLAGS_seed)));
    c.set_optimizer(absl::GetFlag(FLAGS_optimizer));
    c.set_warmup_rounds(absl::GetFlag(FLAGS_warmup_rounds));
    c.set_overlap_anchor(absl::GetFlag(FLAGS_overlap_anchor));
    c.set_synthetic(data->synthetic);
    std::ofstream(dir + "/run.json") << ToJsonLine(c);
  }
  const volatile sig_atomic_t* const interrupted_flag = CatchInterrupts();

  std::printf(
      "tern run: %s, %d clients (%d per round), %d rounds, update codec %s, rule %s, %s on %s%s\n",
      mode.c_str(), n, k, rounds, absl::GetFlag(FLAGS_update_codec).c_str(),
      absl::GetFlag(FLAGS_rule).c_str(), absl::GetFlag(FLAGS_model).c_str(),
      data->test.source.c_str(), data->synthetic ? " (synthetic)" : "");
  std::printf("run folder: %s\n", dir.c_str());
  std::fflush(stdout);

  // The server.
  const std::string port_file = dir + "/server.port";
  const std::string ckpt = dir + "/server.ckpt";
  ::unlink(port_file.c_str());
  ::unlink(ckpt.c_str());
  auto server_args = [&](int listen_port) {
    std::vector<std::string> a = {
        "server", absl::StrCat("--listen=127.0.0.1:", listen_port),
        absl::StrCat("--port_file=", port_file), absl::StrCat("--checkpoint=", ckpt),
        absl::StrCat("--mode=", mode), absl::StrCat("--run_id=", absl::GetFlag(FLAGS_run_id)),
        absl::StrCat("--min_clients=",
                     absl::GetFlag(FLAGS_min_clients) > 0 ? absl::GetFlag(FLAGS_min_clients) : n),
        absl::StrCat("--rounds=", rounds),
        absl::StrCat("--clients_per_round=", absl::GetFlag(FLAGS_clients_per_round)),
        absl::StrCat("--min_replies=", absl::GetFlag(FLAGS_min_replies)),
        absl::StrCat("--grace_s=", absl::GetFlag(FLAGS_grace_s)),
        absl::StrCat("--round_deadline_s=", absl::GetFlag(FLAGS_round_deadline_s)),
        absl::StrCat("--staleness_decay=", absl::GetFlag(FLAGS_staleness_decay)),
        absl::StrCat("--max_staleness=", absl::GetFlag(FLAGS_max_staleness)),
        absl::StrCat("--sampling=", absl::GetFlag(FLAGS_sampling)),
        absl::StrCat("--rule=", absl::GetFlag(FLAGS_rule)),
        absl::StrCat("--server_lr=", absl::GetFlag(FLAGS_server_lr)),
        absl::StrCat("--server_momentum=", absl::GetFlag(FLAGS_server_momentum)),
        absl::StrCat("--downstream=", absl::GetFlag(FLAGS_downstream)),
        absl::StrCat("--downstream_codec=", absl::GetFlag(FLAGS_downstream_codec)),
        absl::StrCat("--update_codec=", absl::GetFlag(FLAGS_update_codec)),
        absl::StrCat("--error_feedback=", absl::GetFlag(FLAGS_error_feedback) ? "true" : "false"),
        absl::StrCat("--memory=", absl::GetFlag(FLAGS_memory)),
        absl::StrCat("--optimizer=", absl::GetFlag(FLAGS_optimizer)),
        absl::StrCat("--warmup_rounds=", absl::GetFlag(FLAGS_warmup_rounds)),
        absl::StrCat("--beta1=", absl::GetFlag(FLAGS_beta1)),
        absl::StrCat("--adaptive_batch_eta=", absl::GetFlag(FLAGS_adaptive_batch_eta)),
        absl::StrCat("--max_batch=", absl::GetFlag(FLAGS_max_batch)),
        absl::StrCat("--overlap_anchor=", absl::GetFlag(FLAGS_overlap_anchor)),
        absl::StrCat("--beta2=", absl::GetFlag(FLAGS_beta2)),
        absl::StrCat("--eps=", absl::GetFlag(FLAGS_eps)),
        absl::StrCat("--local_epochs=", absl::GetFlag(FLAGS_local_epochs)),
        absl::StrCat("--local_steps=", absl::GetFlag(FLAGS_local_steps)),
        absl::StrCat("--local_momentum=", absl::GetFlag(FLAGS_local_momentum)),
        absl::StrCat("--batch=", absl::GetFlag(FLAGS_batch)), absl::StrCat("--lr=", FedLr()),
        absl::StrCat("--seed=", absl::GetFlag(FLAGS_seed)),
        absl::StrCat("--client_timeout_s=", absl::GetFlag(FLAGS_client_timeout_s)),
        // The launcher stops the server once it has evaluated the last round.
        "--linger_s=600", absl::StrCat("--log_level=", absl::GetFlag(FLAGS_log_level))};
    return a;
  };
  ChildProcess server;
  server.what = "server";
  server.log = dir + "/server.log";
  server.pid = Spawn(self_exe, server_args(0), server.log);
  server.alive = server.pid > 0;
  const int port = WaitForPortFile(port_file, server, 60, interrupted_flag);
  if (port == 0) {
    std::fprintf(stderr, "tern run: the server did not start; its log:\n%s\n",
                 Tail(server.log).c_str());
    StopAll({&server});
    return 1;
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);
  // The clients, `per` to a process.
  std::vector<ChildProcess> groups((n + per - 1) / per);
  for (size_t g = 0; g < groups.size(); ++g) {
    const int first = static_cast<int>(g) * per;
    ChildProcess& c = groups[g];
    c.id = static_cast<int>(g);
    c.what = "client group";
    c.log = absl::StrCat(dir, "/clients-", g, ".log");
    std::vector<std::string> args = {"client",
                                     absl::StrCat("--server=", address),
                                     absl::StrCat("--clients=", std::min(per, n - first)),
                                     absl::StrCat("--first_client=", first),
                                     absl::StrCat("--partitions=", n),
                                     absl::StrCat("--partition=", absl::GetFlag(FLAGS_partition)),
                                     absl::StrCat("--model=", absl::GetFlag(FLAGS_model)),
                                     absl::StrCat("--data=", absl::GetFlag(FLAGS_data)),
                                     absl::StrCat("--seed=", absl::GetFlag(FLAGS_seed)),
                                     absl::StrCat("--run_id=", absl::GetFlag(FLAGS_run_id)),
                                     absl::StrCat("--log_level=", absl::GetFlag(FLAGS_log_level))};
    c.pid = Spawn(self_exe, args, c.log);
    c.alive = c.pid > 0;
  }
  auto all = [&] {
    std::vector<ChildProcess*> v = {&server};
    for (ChildProcess& c : groups) v.push_back(&c);
    return v;
  };
  auto stub = v1::Aggregator::NewStub(MakeChannel(address));

  std::ofstream metrics(dir + "/metrics.jsonl");
  const std::vector<ParamTensor>& layout = (*model)->Layout();
  const bool tty = isatty(1);
  const absl::Time start = absl::Now();
  int64_t evaluated = -1;
  double last_acc = 0;
  v1::ServerStatus last;
  bool server_killed = false, client_killed = false;
  absl::Time last_draw = absl::InfinitePast();
  while (!*interrupted_flag) {
    Reap(all());
    if (!server.alive) {
      if (server_killed && evaluated < rounds) {
        // Restart after the injected fault: the checkpoint brings the run back.
        ::unlink(port_file.c_str());
        // On the same port: the clients know that address.
        server.pid = Spawn(self_exe, server_args(port), server.log + ".restarted");
        server.alive = server.pid > 0;
        server.log += ".restarted";
        server_killed = false;
        const int p2 = WaitForPortFile(port_file, server, 60, interrupted_flag);
        if (p2 == 0) break;
        std::fprintf(stderr, "\n[fault injection] server restarted from its checkpoint\n");
        continue;
      }
      std::fprintf(stderr, "\ntern run: the server exited; log:\n%s\n", Tail(server.log).c_str());
      break;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    v1::ServerStatus st;
    if (!stub->Status(&ctx, v1::StatusRequest(), &st).ok()) {
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    const int64_t done_rounds = static_cast<int64_t>(st.round());
    if (kill_server_round > 0 && !server_killed && done_rounds >= kill_server_round &&
        st.restarts() == 0) {
      kill(server.pid, SIGKILL);
      server_killed = true;
      std::fprintf(stderr, "\n[fault injection] killed the server after round %lld\n",
                   static_cast<long long>(done_rounds));
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    if (kill_group >= 0 && !client_killed && done_rounds >= kill_client_round &&
        groups[static_cast<size_t>(kill_group)].alive) {
      kill(groups[static_cast<size_t>(kill_group)].pid, SIGKILL);
      client_killed = true;
      std::fprintf(stderr, "\n[fault injection] killed client group %d after round %lld\n",
                   kill_group, static_cast<long long>(done_rounds));
    }
    if (done_rounds > evaluated) {
      // Every round in order while the server still keeps its model (the last few), so a fast
      // run still has one point per round, each with the counters of its close.
      for (int64_t r = std::max<int64_t>(evaluated + 1, 1); r <= done_rounds; ++r) {
        v1::ServerStatus rs;
        auto x = FetchGlobalModel(*stub, r, layout, *codecs, &rs);
        if (!x.has_value()) {
          if (r == done_rounds) break;  // try again on the next pass
          evaluated = r;                // an older round no longer kept: skipped
          continue;
        }
        const EvalResult ev = (*model)->Evaluate(*x, data->test.features.data(),
                                                 data->test.labels.data(), data->test.size());
        evaluated = r;
        last_acc = ev.accuracy;
        last = rs;
        const double wall = absl::ToDoubleSeconds(absl::Now() - start);
        const double up = static_cast<double>(rs.payload_bytes_up());
        const double down = static_cast<double>(rs.payload_bytes_down());
        const double dense = static_cast<double>(rs.dense_bytes_up() + rs.dense_bytes_down());
        v1::MetricsRow row;
        row.set_step(static_cast<int32_t>(r));
        row.set_round(static_cast<int32_t>(r));
        row.set_wall_s(wall);
        row.set_workers(static_cast<int32_t>(rs.clients_alive()));
        if (r > 0) row.set_train_loss(rs.train_loss());  // no loss before the first round
        row.set_test_loss(ev.loss);
        row.set_test_acc(ev.accuracy);
        row.set_updates(static_cast<int32_t>(rs.last_round_updates()));
        row.set_mb_sent_per_worker((up + down) / n / 1e6);
        row.set_payload_mb_up(up / 1e6);
        row.set_payload_mb_down(down / 1e6);
        row.set_wire_mb_up(static_cast<double>(rs.wire_bytes_up()) / 1e6);
        row.set_wire_mb_down(static_cast<double>(rs.wire_bytes_down()) / 1e6);
        row.set_dense_mb_up(static_cast<double>(rs.dense_bytes_up()) / 1e6);
        row.set_dense_mb_down(static_cast<double>(rs.dense_bytes_down()) / 1e6);
        row.set_compression(up + down > 0 ? dense / (up + down) : 1.0);
        row.set_updates_accepted(static_cast<int32_t>(rs.updates_accepted()));
        row.set_updates_refused(static_cast<int32_t>(rs.updates_refused()));
        row.set_updates_dropped(static_cast<int32_t>(rs.updates_dropped()));
        row.set_restarts(static_cast<int32_t>(rs.restarts()));
        if (r > 0) {
          row.set_closed_s(rs.round_closed_unix_s() -
                           absl::ToDoubleSeconds(start - absl::UnixEpoch()));
        }
        if (rs.mean_batch() > 0) row.set_batch(rs.mean_batch());
        metrics << ToJsonLine(row);
        metrics.flush();
        std::printf(
            "%sround %lld/%d [%s] | %u updates | train loss %.3f | acc %.2f%% | up %.2f MB | "
            "down %.2f MB | %u clients | %.0fs\n",
            tty ? "\r\033[K" : "", static_cast<long long>(r), rounds,
            ProgressBar(static_cast<double>(r) / rounds).c_str(), rs.last_round_updates(),
            rs.train_loss(), 100 * ev.accuracy, up / 1e6, down / 1e6, rs.clients_alive(), wall);
        std::fflush(stdout);
      }
    } else if (tty && absl::Now() - last_draw > absl::Milliseconds(500)) {
      std::printf("\r\033[Kround %lld/%d in progress%s | %u clients alive | %.0fs",
                  static_cast<long long>(done_rounds + 1), rounds,
                  done_rounds == 0 && !st.round_open() ? " (waiting for clients)" : "",
                  st.clients_alive(), absl::ToDoubleSeconds(absl::Now() - start));
      std::fflush(stdout);
      last_draw = absl::Now();
    }
    if (evaluated >= rounds) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  const bool interrupted = *interrupted_flag != 0;
  stub.reset();  // an open connection would hold the server's graceful shutdown to its grace
  StopAll(all());
  metrics.close();
  auto run = LoadRun(dir);
  if (run.ok()) std::ofstream(dir + "/report.html") << RenderReport({*run});
  if (interrupted) {
    std::printf("\ninterrupted; partial results in %s\n", dir.c_str());
    return 130;
  }
  if (evaluated < rounds) {
    std::printf("run did not finish (last round %lld); see %s/*.log\n",
                static_cast<long long>(evaluated), dir.c_str());
    return 1;
  }
  std::printf(
      "done: test accuracy %.2f%% after %d rounds; %.2f MB up, %.2f MB down in all "
      "(%.1fx less than dense)\nreport: %s/report.html\n",
      100 * last_acc, rounds, last.payload_bytes_up() / 1e6, last.payload_bytes_down() / 1e6,
      static_cast<double>(last.dense_bytes_up() + last.dense_bytes_down()) /
          std::max<double>(
              1, static_cast<double>(last.payload_bytes_up() + last.payload_bytes_down())),
      dir.c_str());
  return 0;
}

}  // namespace tern
