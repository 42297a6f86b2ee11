// `tern run --mode federated|local-sgd|ps`: a server plus N clients as processes on 127.0.0.1,
// with the same progress line, metrics.jsonl and report as gossip runs.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/aggregator_flags.h"
#include "cli/client_flags.h"
#include "cli/commands.h"
#include "cli/local_cluster.h"
#include "cli/process.h"
#include "cli/report.h"
#include "cli/run_health.h"
#include "clients/cpp/fed_client.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/train_flags.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/workload/builtin_model.h"
#include "core/workload/dataset.h"
#include "grpcpp/grpcpp.h"
#include "kernels/builtin.h"
#include "server/service.h"
#include "tern/v1/records.pb.h"
#include "tern/v1/server.grpc.pb.h"

ABSL_DECLARE_FLAG(bool, tls);
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, name);
ABSL_DECLARE_FLAG(std::string, lr_schedule);

ABSL_FLAG(tern::Int<tern::AtLeast(1)>, clients_per_process, 25,
          "run: simulated clients per client process");
ABSL_FLAG(std::string, kill_server_at_round, "",
          "run: fault injection, R: SIGKILL the server once round R closed, then restart it");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, edges, 0,
          "run: E > 0: E edge aggregators (tern server --parent), each the parent's client for "
          "a site of --clients/E clients that train with it; the codec flags are the uplinks' "
          "(edge to parent), a site's clients send the edge uncompressed");
ABSL_FLAG(std::vector<std::string>, site_netns, {},
          "run: a network namespace per site (`ip netns exec`, root only): site s's clients (and "
          "its edge, with --edges) run in the s-th, as behind one link; with --site_hosts, the "
          "address each site serves on there, and --server_host the server's (run tern run in "
          "the server's namespace)");
ABSL_FLAG(std::vector<std::string>, site_hosts, {},
          "run: with --site_netns, the IP of each site's namespace (its edge listens there)");
ABSL_FLAG(std::string, server_host, "127.0.0.1",
          "run: the IP the server listens on (beyond loopback: plaintext, for emulated links)");
ABSL_FLAG(std::string, kill_edge_at_round, "",
          "run: fault injection, R: SIGKILL edge 0 once round R closed, then restart it");
ABSL_FLAG(std::string, kill_client_at_round, "",
          "run: fault injection, G@R[,G@R...]: SIGKILL client process G once round R closed");

namespace tern {

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

// What an aggregator run is, from the flags, checked before anything starts.
struct FedRun {
  std::string mode;
  int n = 0;    // clients
  int per = 1;  // clients per process
  int rounds = 0;
  int k = 0;                                          // clients per round
  int kill_server_round = -1;                         // --kill_server_at_round
  int kill_edge_round = -1;                           // --kill_edge_at_round
  std::vector<std::pair<int, int64_t>> client_kills;  // --kill_client_at_round: (group, round)
  int edges = 0;                                      // --edges
  std::vector<std::string> netns, hosts;              // --site_netns, --site_hosts
  std::string server_host = "127.0.0.1";              // --server_host
  // Sites: the clients of site (and edge) e are [site_first(e), site_first(e + 1)); one site
  // without edges or namespaces.
  int sites() const { return std::max({1, edges, static_cast<int>(netns.size())}); }
  std::string site_netns(int e) const { return netns.empty() ? "" : netns[static_cast<size_t>(e)]; }
  std::string site_host(int e) const {
    return hosts.empty() ? "127.0.0.1" : hosts[static_cast<size_t>(e)];
  }
  int site_first(int e) const { return static_cast<int>(int64_t{n} * e / sites()); }
  int site_size(int e) const { return site_first(e + 1) - site_first(e); }
  // Client processes: `per` clients each, never across two sites.
  int groups() const {
    int g = 0;
    for (int e = 0; e < sites(); ++e) g += (site_size(e) + per - 1) / per;
    return g;
  }
};

absl::Status CheckFedFlags(const ServerRegistries& registries, FedRun* run) {
  if (absl::Status a = ParseAttack(absl::GetFlag(FLAGS_attack)).status(); !a.ok()) return a;
  TERN_RETURN_IF_ERROR(ClientDelay(absl::GetFlag(FLAGS_client_delay_s), 0, 1).status());
  TERN_RETURN_IF_ERROR(CheckDataFlags());
  run->mode = absl::GetFlag(FLAGS_mode);
  run->n = absl::GetFlag(FLAGS_clients).value;
  run->per = std::max(1, absl::GetFlag(FLAGS_clients_per_process).value);
  run->rounds = absl::GetFlag(FLAGS_rounds).value;
  if (run->n < 1 || run->n > 10000 || run->rounds < 1) {
    return absl::InvalidArgumentError("need 1 <= --clients <= 10000 and --rounds >= 1");
  }
  run->k = run->n;
  if (run->mode == "federated") {
    run->k = std::min(run->n, absl::GetFlag(FLAGS_clients_per_round).value);
  } else if (const int c = absl::GetFlag(FLAGS_concurrency).value;
             run->mode == "fedbuff" && c > 0) {
    run->k = std::min(run->n, c);
  }
  TERN_ASSIGN_OR_RETURN(ServerOptions so, ServerOptionsFromFlags());
  TERN_RETURN_IF_ERROR(NormalizeAggregatorOptions(so.aggregator, *registries.codecs).status());
  TERN_RETURN_IF_ERROR(registries.rules->Create(so.aggregator.rule).status());
  run->edges = absl::GetFlag(FLAGS_edges).value;
  run->netns = absl::GetFlag(FLAGS_site_netns);
  run->hosts = absl::GetFlag(FLAGS_site_hosts);
  run->server_host = absl::GetFlag(FLAGS_server_host);
  if (!run->netns.empty()) {
    if (run->hosts.size() != run->netns.size()) {
      return absl::InvalidArgumentError("--site_hosts: one IP for each of --site_netns");
    }
    if (run->edges > 0 && run->edges != static_cast<int>(run->netns.size())) {
      return absl::InvalidArgumentError("--edges: one edge for each of --site_netns");
    }
    if (static_cast<int>(run->netns.size()) > run->n) {
      return absl::InvalidArgumentError("--site_netns: more sites than --clients");
    }
  } else if (!run->hosts.empty()) {
    return absl::InvalidArgumentError("--site_hosts goes with --site_netns");
  }
  if (run->edges > 0) {
    if (run->mode != "federated" && run->mode != "local-sgd") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--edges: edge aggregators run federated or local-sgd rounds, not ", run->mode));
    }
    if (run->edges > run->n) {
      return absl::InvalidArgumentError(absl::StrCat("--edges=", run->edges,
                                                     " is more than --clients=", run->n,
                                                     ": every edge needs a client"));
    }
    so.aggregator.edge_rounds = absl::GetFlag(FLAGS_edge_rounds).value;
    so.aggregator.downstream = "model";
    so.aggregator.lr_schedule = "constant";  // the parent's rate reaches its clients (EdgeArgs)
    TERN_RETURN_IF_ERROR(NormalizeAggregatorOptions(so.aggregator, *registries.codecs).status());
  }
  if (const std::string k = absl::GetFlag(FLAGS_kill_edge_at_round); !k.empty()) {
    if (run->edges < 1 || !absl::SimpleAtoi(k, &run->kill_edge_round) || run->kill_edge_round < 1 ||
        run->kill_edge_round >= run->rounds) {
      return absl::InvalidArgumentError("--kill_edge_at_round wants --edges and R in [1, rounds)");
    }
  }
  if (const std::string k = absl::GetFlag(FLAGS_kill_server_at_round); !k.empty()) {
    if (!absl::SimpleAtoi(k, &run->kill_server_round) || run->kill_server_round < 1 ||
        run->kill_server_round >= run->rounds) {
      return absl::InvalidArgumentError("--kill_server_at_round wants R in [1, rounds)");
    }
  }
  TERN_ASSIGN_OR_RETURN(run->client_kills, ParseKillList(absl::GetFlag(FLAGS_kill_client_at_round),
                                                         "kill_client_at_round", run->groups(), 1));
  return absl::OkStatus();
}

std::string FedRunName(const FedRun& run) {
  std::string name = absl::GetFlag(FLAGS_name);
  if (!name.empty()) return name;
  const std::string what = absl::GetFlag(FLAGS_memory).rfind("dgc", 0) == 0
                               ? absl::GetFlag(FLAGS_memory)
                               : absl::GetFlag(FLAGS_update_codec);
  name = absl::StrCat(run.mode, "-", absl::StrReplaceAll(what, {{":", "-"}, {",", "-"}, {"=", ""}}),
                      "-", run.n, "clients");
  if (run.edges > 0) name = absl::StrCat(name, "-", run.edges, "edges");
  if (absl::GetFlag(FLAGS_overlap_anchor).value > 0) name = absl::StrCat("overlap-", name);
  return name;
}

v1::RunConfig FedConfig(const std::string& name, const FedRun& run, const TrainTest& data) {
  v1::RunConfig c;
  c.set_name(name);
  c.set_mode(run.mode);
  c.set_algorithm(run.mode);
  c.set_codec(absl::GetFlag(FLAGS_update_codec));
  c.set_topology("server");
  c.set_rule(absl::GetFlag(FLAGS_rule));
  c.set_model(absl::GetFlag(FLAGS_model));
  c.set_partition(absl::GetFlag(FLAGS_partition));
  c.set_data(data.test.source);
  c.set_workers(run.n);
  c.set_clients_per_round(run.k);
  c.set_rounds(run.rounds);
  c.set_local_epochs(absl::GetFlag(FLAGS_local_epochs).value);
  c.set_local_steps(absl::GetFlag(FLAGS_local_steps).value);
  c.set_batch(absl::GetFlag(FLAGS_batch).value);
  c.set_lr(FedLr());
  c.set_lr_schedule(absl::GetFlag(FLAGS_lr_schedule));
  c.set_server_lr(absl::GetFlag(FLAGS_server_lr).value);
  c.set_server_momentum(absl::GetFlag(FLAGS_server_momentum).value);
  if (!absl::GetFlag(FLAGS_outer).empty()) c.set_outer(absl::GetFlag(FLAGS_outer));
  c.set_downstream(absl::GetFlag(FLAGS_downstream));
  c.set_downstream_codec(absl::GetFlag(FLAGS_downstream_codec));
  c.set_seed(static_cast<double>(absl::GetFlag(FLAGS_seed)));
  c.set_optimizer(absl::GetFlag(FLAGS_optimizer));
  c.set_warmup_rounds(absl::GetFlag(FLAGS_warmup_rounds).value);
  c.set_overlap_anchor(absl::GetFlag(FLAGS_overlap_anchor).value);
  c.set_synthetic(data.synthetic);
  return c;
}

// A daemon serving on `host` beyond loopback without TLS says so (emulated links' runs).
std::vector<std::string> PlaintextBeyondLoopback(const std::string& host) {
  if (host.rfind("127.", 0) == 0 || host == "localhost" || absl::GetFlag(FLAGS_tls)) return {};
  return {"--plaintext"};
}

// `tern server`'s flags for the run's settings, listening on `port` (0: any).
std::vector<std::string> ServerFlags(const FedRun& run, const std::string& dir, int port) {
  return {
      "server", absl::StrCat("--listen=", run.server_host, ":", port),
      absl::StrCat("--port_file=", dir, "/server.port"),
      absl::StrCat("--checkpoint=", dir, "/server.ckpt"), absl::StrCat("--mode=", run.mode),
      absl::StrCat("--run_id=", absl::GetFlag(FLAGS_run_id)),
      absl::StrCat("--min_clients=", absl::GetFlag(FLAGS_min_clients).value > 0
                                         ? absl::GetFlag(FLAGS_min_clients).value
                                         : run.n),
      absl::StrCat("--rounds=", run.rounds),
      absl::StrCat("--clients_per_round=", absl::GetFlag(FLAGS_clients_per_round).value),
      absl::StrCat("--min_replies=", absl::GetFlag(FLAGS_min_replies).value),
      absl::StrCat("--grace_s=", absl::GetFlag(FLAGS_grace_s).value),
      absl::StrCat("--round_deadline_s=", absl::GetFlag(FLAGS_round_deadline_s).value),
      absl::StrCat("--learned_deadline_k=", absl::GetFlag(FLAGS_learned_deadline_k).value),
      absl::StrCat("--deadline_floor_s=", absl::GetFlag(FLAGS_deadline_floor_s).value),
      absl::StrCat("--staleness_decay=", absl::GetFlag(FLAGS_staleness_decay).value),
      absl::StrCat("--max_staleness=", absl::GetFlag(FLAGS_max_staleness).value),
      absl::StrCat("--buffer=", absl::GetFlag(FLAGS_buffer).value),
      absl::StrCat("--concurrency=", absl::GetFlag(FLAGS_concurrency).value),
      absl::StrCat("--staleness=", absl::GetFlag(FLAGS_staleness)),
      absl::StrCat("--sampling=", absl::GetFlag(FLAGS_sampling)),
      absl::StrCat("--rule=", absl::GetFlag(FLAGS_rule)),
      absl::StrCat("--norm_guard=", absl::GetFlag(FLAGS_norm_guard).value),
      absl::StrCat("--server_lr=", absl::GetFlag(FLAGS_server_lr).value),
      absl::StrCat("--server_momentum=", absl::GetFlag(FLAGS_server_momentum).value),
      absl::StrCat("--outer=", absl::GetFlag(FLAGS_outer)),
      absl::StrCat("--eval_every=", absl::GetFlag(FLAGS_eval_every).value),
      absl::StrCat("--dp_clip=", absl::GetFlag(FLAGS_dp_clip).value),
      absl::StrCat("--dp_noise=", absl::GetFlag(FLAGS_dp_noise).value),
      absl::StrCat("--dp_delta=", absl::GetFlag(FLAGS_dp_delta).value),
      absl::StrCat("--dp_epsilon_budget=", absl::GetFlag(FLAGS_dp_epsilon_budget).value),
      absl::StrCat("--dp_clip_quantile=", absl::GetFlag(FLAGS_dp_clip_quantile).value),
      absl::StrCat("--dp_clip_lr=", absl::GetFlag(FLAGS_dp_clip_lr).value),
      absl::StrCat("--dp_clip_count_noise=", absl::GetFlag(FLAGS_dp_clip_count_noise).value),
      absl::StrCat("--secagg=", absl::GetFlag(FLAGS_secagg) ? "true" : "false"),
      absl::StrCat("--secagg_neighbours=", absl::GetFlag(FLAGS_secagg_neighbours).value),
      absl::StrCat("--secagg_threshold=", absl::GetFlag(FLAGS_secagg_threshold).value),
      absl::StrCat("--secagg_bits=", absl::GetFlag(FLAGS_secagg_bits).value),
      absl::StrCat("--secagg_levels=", absl::GetFlag(FLAGS_secagg_levels).value),
      absl::StrCat("--secagg_range=", absl::GetFlag(FLAGS_secagg_range).value),
      absl::StrCat("--secagg_stage_timeout_s=", absl::GetFlag(FLAGS_secagg_stage_timeout_s).value),
      absl::StrCat("--downstream=", absl::GetFlag(FLAGS_downstream)),
      absl::StrCat("--downstream_codec=", absl::GetFlag(FLAGS_downstream_codec)),
      absl::StrCat("--update_codec=", absl::GetFlag(FLAGS_update_codec)),
      absl::StrCat("--error_feedback=", absl::GetFlag(FLAGS_error_feedback) ? "true" : "false"),
      absl::StrCat("--memory=", absl::GetFlag(FLAGS_memory)),
      absl::StrCat("--optimizer=", absl::GetFlag(FLAGS_optimizer)),
      absl::StrCat("--warmup_rounds=", absl::GetFlag(FLAGS_warmup_rounds).value),
      absl::StrCat("--beta1=", absl::GetFlag(FLAGS_beta1).value),
      absl::StrCat("--adaptive_batch_eta=", absl::GetFlag(FLAGS_adaptive_batch_eta).value),
      absl::StrCat("--max_batch=", absl::GetFlag(FLAGS_max_batch).value),
      absl::StrCat("--overlap_anchor=", absl::GetFlag(FLAGS_overlap_anchor).value),
      absl::StrCat("--beta2=", absl::GetFlag(FLAGS_beta2).value),
      absl::StrCat("--eps=", absl::GetFlag(FLAGS_eps).value),
      absl::StrCat("--local_epochs=", absl::GetFlag(FLAGS_local_epochs).value),
      absl::StrCat("--local_steps=", absl::GetFlag(FLAGS_local_steps).value),
      absl::StrCat("--local_momentum=", absl::GetFlag(FLAGS_local_momentum).value),
      absl::StrCat("--batch=", absl::GetFlag(FLAGS_batch).value), absl::StrCat("--lr=", FedLr()),
      absl::StrCat("--lr_schedule=", absl::GetFlag(FLAGS_lr_schedule)),
      absl::StrCat("--seed=", absl::GetFlag(FLAGS_seed)),
      absl::StrCat("--client_timeout_s=", absl::GetFlag(FLAGS_client_timeout_s).value),
      // The launcher stops the server once it has evaluated the last round.
      "--linger_s=600", absl::StrCat("--log_level=", absl::GetFlag(FLAGS_log_level))};
}

// `tern server` with the run's settings, listening on `port` (0: any).
std::vector<std::string> ServerArgs(const FedRun& run, const std::string& dir, int port) {
  return Concat(ServerFlags(run, dir, port), PlaintextBeyondLoopback(run.server_host));
}

// The parent of a run with edges: its clients are the edges, every one in every round (a later
// flag overrides an earlier one).
std::vector<std::string> ParentArgs(const FedRun& run, const std::string& dir, int port) {
  std::vector<std::string> args = ServerArgs(run, dir, port);
  if (run.edges == 0) return args;
  return Concat(args, {absl::StrCat("--min_clients=", run.edges),
                       absl::StrCat("--clients_per_round=", run.edges),
                       absl::StrCat("--min_replies=", run.edges)});
}

// Edge `e` of a run with edges, listening on `port` (0: any), the parent's client: a site's
// clients each round (as many of them as --clients_per_round takes of all), sending updates
// uncompressed over the site's LAN; the rounds' other settings as the run's.
std::vector<std::string> EdgeArgs(const FedRun& run, const std::string& dir, int e,
                                  const std::string& parent, int port) {
  const int site = run.site_size(e);
  const int k =
      std::clamp(static_cast<int>(std::lround(static_cast<double>(run.k) * site / run.n)), 1, site);
  const int min_replies = absl::GetFlag(FLAGS_min_replies).value;
  // Its listen address replaces the server's (a later flag overrides an earlier one).
  return Concat(Concat(ServerFlags(run, dir, port), PlaintextBeyondLoopback(run.site_host(e))),
                {absl::StrCat("--listen=", run.site_host(e), ":", port),
                 absl::StrCat("--port_file=", dir, "/edge-", e, ".port"),
                 absl::StrCat("--checkpoint=", dir, "/edge-", e, ".ckpt"),
                 absl::StrCat("--parent=", parent),
                 absl::StrCat("--edge_name=edge-", e),
                 absl::StrCat("--edge_rounds=", absl::GetFlag(FLAGS_edge_rounds).value),
                 absl::StrCat("--min_clients=", site),
                 absl::StrCat("--clients_per_round=", k),
                 absl::StrCat("--min_replies=",
                              min_replies > 0 ? std::clamp(min_replies * site / run.n, 1, k) : k),
                 "--update_codec=none",
                 "--error_feedback=false",
                 "--memory=",
                 "--downstream=model",
                 "--downstream_codec=none",
                 "--server_lr=1",
                 "--server_momentum=0",
                 "--outer=",
                 "--lr_schedule=constant",  // its clients train at the parent task's rate
                 "--dp_clip=0",
                 "--secagg=false",
                 "--linger_s=5"});
}

// The client processes, `per` clients to each, a site's (`addresses[e]`: its edge, or the one
// server) apart from another's.
std::vector<ChildProcess*> StartClientGroups(LocalCluster& cluster, const FedRun& run,
                                             const std::vector<std::string>& addresses) {
  std::vector<ChildProcess*> groups;
  for (int e = 0; e < run.sites(); ++e) {
    const int end = run.site_first(e + 1);
    for (int first = run.site_first(e); first < end; first += run.per) {
      const int g = static_cast<int>(groups.size());
      groups.push_back(cluster.Start(
          "client group", g,
          Concat({"client", absl::StrCat("--server=", addresses[static_cast<size_t>(e)]),
                  absl::StrCat("--clients=", std::min(run.per, end - first)),
                  absl::StrCat("--first_client=", first), absl::StrCat("--partitions=", run.n),
                  absl::StrCat("--partition=", absl::GetFlag(FLAGS_partition)),
                  absl::StrCat("--model=", absl::GetFlag(FLAGS_model)),
                  absl::StrCat("--data=", absl::GetFlag(FLAGS_data)),
                  absl::StrCat("--seed=", absl::GetFlag(FLAGS_seed)),
                  absl::StrCat("--run_id=", absl::GetFlag(FLAGS_run_id)),
                  absl::StrCat("--attack=", absl::GetFlag(FLAGS_attack)),
                  absl::StrCat("--attack_fraction=", absl::GetFlag(FLAGS_attack_fraction).value),
                  absl::StrCat("--client_delay_s=", absl::GetFlag(FLAGS_client_delay_s)),
                  absl::StrCat("--log_level=", absl::GetFlag(FLAGS_log_level))},
                 cluster.TlsArgs("clients")),
          absl::StrCat("clients-", g, ".log"), run.site_netns(e)));
    }
  }
  return groups;
}

// The metrics row of round `r` from the server's counters at its close and the test accuracy
// of its global model.
v1::MetricsRow RoundRow(const FedRun& run, int64_t r, const v1::ServerStatus& rs,
                        const EvalResult& ev, absl::Time start) {
  const double up = static_cast<double>(rs.payload_bytes_up());
  const double down = static_cast<double>(rs.payload_bytes_down());
  const double dense = static_cast<double>(rs.dense_bytes_up() + rs.dense_bytes_down());
  v1::MetricsRow row;
  row.set_step(static_cast<int32_t>(r));
  row.set_round(static_cast<int32_t>(r));
  row.set_wall_s(absl::ToDoubleSeconds(absl::Now() - start));
  row.set_workers(static_cast<int32_t>(rs.clients_alive()));
  row.set_train_loss(rs.train_loss());
  if (rs.lr() > 0) row.set_lr(static_cast<float>(rs.lr()));
  row.set_test_loss(ev.loss);
  row.set_test_acc(ev.accuracy);
  row.set_updates(static_cast<int32_t>(rs.last_round_updates()));
  row.set_mb_sent_per_worker((up + down) / run.n / 1e6);
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
  row.set_closed_s(rs.round_closed_unix_s() - absl::ToDoubleSeconds(start - absl::UnixEpoch()));
  if (rs.mean_batch() > 0) row.set_batch(rs.mean_batch());
  if (rs.dp_clip() > 0) {
    row.set_dp_epsilon(static_cast<float>(rs.dp_epsilon()));
    row.set_dp_clip(static_cast<float>(rs.dp_clip()));
  }
  if (rs.secagg_bytes() > 0) {
    row.set_secagg_mb(static_cast<float>(static_cast<double>(rs.secagg_bytes()) / 1e6));
    row.set_secagg_dropped(static_cast<int64_t>(rs.secagg_dropped()));
  }
  for (uint64_t n : rs.staleness()) row.add_staleness(static_cast<int64_t>(n));
  return row;
}

// The port of "HOST:PORT" (0 when there is none).
int PortOf(const std::string& address) {
  int port = 0;
  (void)absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port);
  return port;
}

// Watches an aggregator run: evaluates every closed round's global model, injects the faults
// asked for (and restarts the killed server from its checkpoint).
class FedWatch {
 public:
  // `edges` and `edge_addresses`: a run with edges' (empty otherwise).
  FedWatch(LocalCluster* cluster, const FedRun& run, ChildProcess* server,
           std::vector<ChildProcess*> groups, const std::string& address,
           std::vector<ChildProcess*> edges, const std::vector<std::string>& edge_addresses,
           const EvalSetup* eval, const CodecRegistry* codecs)
      : cluster_(*cluster),
        run_(run),
        server_(server),
        groups_(std::move(groups)),
        edges_(std::move(edges)),
        port_(PortOf(address)),
        address_(address),
        stub_(v1::Aggregator::NewStub(
            MakeChannel(address, ChannelKind::kDefault, cluster->credentials()))),
        eval_(*eval),
        codecs_(*codecs) {
    for (const std::string& a : edge_addresses) {
      edge_ports_.push_back(PortOf(a));
      edge_stubs_.push_back(
          v1::Aggregator::NewStub(MakeChannel(a, ChannelKind::kDefault, cluster->credentials())));
    }
  }

  // Until the last round is evaluated, the server is gone or Ctrl-C.
  void Run() {
    while (!cluster_.interrupted() && evaluated_ < run_.rounds) {
      cluster_.Reap();
      if (!server_->alive && !RestartKilledServer()) break;
      if (!server_->alive) continue;
      if (!edges_.empty() && !edges_[0]->alive && !RestartKilledEdge()) break;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      v1::ServerStatus st;
      if (!stub_->Status(&ctx, v1::StatusRequest(), &st).ok()) {
        absl::SleepFor(absl::Milliseconds(100));
        continue;
      }
      const int64_t done = static_cast<int64_t>(st.round());
      if (InjectFaults(done, st)) continue;
      if (st.done() && !st.stop_reason().empty() && done <= std::max<int64_t>(evaluated_, 0)) {
        stop_reason_ = st.stop_reason();  // ended before its last round, by the server's rule
        break;
      }
      if (done > evaluated_) {
        EvaluateRounds(done);
      } else {
        DrawLiveLine(done, st);
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    stub_.reset();  // an open connection would hold the server's graceful shutdown to its grace
    edge_stubs_.clear();
  }

  int64_t evaluated() const { return evaluated_; }
  // Why the server ended the run before its last round ("" when it did not).
  const std::string& stop_reason() const { return stop_reason_; }
  double last_acc() const { return last_acc_; }
  double best_acc() const { return best_acc_; }
  const v1::ServerStatus& last() const { return last_; }
  // The edges' counters summed (as of the last round evaluated), their restarts and their
  // parent traffic.
  const v1::ServerStatus& edges_last() const { return edges_last_; }

 private:
  // The server died: restarted (true) when it was the injected fault, else false (said why).
  bool RestartKilledServer() {
    if (!server_killed_) {
      std::fprintf(stderr, "\ntern run: the server exited; log:\n%s\n", Tail(server_->log).c_str());
      return false;
    }
    // On the same port (the clients know that address); the checkpoint brings the run back.
    ::unlink((cluster_.dir() + "/server.port").c_str());
    cluster_.Restart(server_,
                     Concat(ServerArgs(run_, cluster_.dir(), port_), cluster_.TlsArgs("server")));
    server_killed_ = false;
    if (!cluster_.WaitForAddress(server_, "server.port", absl::Seconds(60), run_.server_host)
             .ok()) {
      return false;
    }
    std::fprintf(stderr, "\n[fault injection] server restarted from its checkpoint\n");
    return true;
  }

  // Edge 0 died: restarted (true) when it was the injected fault, else false (said why).
  bool RestartKilledEdge() {
    if (!edge_killed_) {
      std::fprintf(stderr, "\ntern run: edge 0 exited; log:\n%s\n", Tail(edges_[0]->log).c_str());
      return false;
    }
    // On the same port (its clients know that address); its checkpoint brings its round back.
    ::unlink((cluster_.dir() + "/edge-0.port").c_str());
    cluster_.Restart(edges_[0], Concat(EdgeArgs(run_, cluster_.dir(), 0, address_, edge_ports_[0]),
                                       cluster_.TlsArgs("edges")));
    edge_killed_ = false;
    if (!cluster_.WaitForAddress(edges_[0], "edge-0.port", absl::Seconds(60), run_.site_host(0))
             .ok()) {
      return false;
    }
    std::fprintf(stderr, "\n[fault injection] edge 0 restarted from its checkpoint\n");
    return true;
  }

  // Every edge's counters, summed (restarts and parent traffic too).
  v1::ServerStatus EdgesStatus() {
    v1::ServerStatus sum;
    for (auto& stub : edge_stubs_) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      v1::ServerStatus st;
      if (!stub->Status(&ctx, v1::StatusRequest(), &st).ok()) return edges_last_;
      sum.set_payload_bytes_up(sum.payload_bytes_up() + st.payload_bytes_up());
      sum.set_payload_bytes_down(sum.payload_bytes_down() + st.payload_bytes_down());
      sum.set_updates_accepted(sum.updates_accepted() + st.updates_accepted());
      sum.set_restarts(sum.restarts() + st.restarts());
      sum.set_parent_bytes_up(sum.parent_bytes_up() + st.parent_bytes_up());
      sum.set_parent_bytes_down(sum.parent_bytes_down() + st.parent_bytes_down());
      sum.set_parent_updates(sum.parent_updates() + st.parent_updates());
    }
    return sum;
  }

  // Returns true when it killed the server (the caller then waits for it to go).
  bool InjectFaults(int64_t done, const v1::ServerStatus& st) {
    if (run_.kill_edge_round > 0 && !edge_killed_ && !edge_was_killed_ &&
        done >= run_.kill_edge_round) {
      // Mid-round: in a round it opened for the parent's next task, once an update reached it
      // and before the last (a round with every update in closes at once, kill or not).
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      v1::ServerStatus es;
      if (edge_stubs_[0]->Status(&ctx, v1::StatusRequest(), &es).ok() && es.round_open()) {
        if (es.round() != edge_round_seen_) {
          edge_round_seen_ = es.round();
          edge_accepted_at_open_ = es.updates_accepted();
        } else if (es.updates_accepted() > edge_accepted_at_open_ &&
                   es.updates_accepted() - edge_accepted_at_open_ < es.clients_alive()) {
          cluster_.Kill(edges_[0]);
          edge_killed_ = edge_was_killed_ = true;
          std::fprintf(
              stderr,
              "\n[fault injection] killed edge 0 in its round %llu (parent round %lld) "
              "with %llu of its updates acknowledged\n",
              static_cast<unsigned long long>(es.round() + 1), static_cast<long long>(done + 1),
              static_cast<unsigned long long>(es.updates_accepted() - edge_accepted_at_open_));
        }
      }
    }
    if (run_.kill_server_round > 0 && !server_killed_ && done >= run_.kill_server_round &&
        st.restarts() == 0) {
      cluster_.Kill(server_);
      server_killed_ = true;
      std::fprintf(stderr, "\n[fault injection] killed the server after round %lld\n",
                   static_cast<long long>(done));
      absl::SleepFor(absl::Milliseconds(200));
      return true;
    }
    for (const auto& [group, round] : run_.client_kills) {
      auto& g = groups_[static_cast<size_t>(group)];
      if (done < round || !g->alive) continue;
      cluster_.Kill(g);
      std::fprintf(stderr, "\n[fault injection] killed client group %d after round %lld\n", group,
                   static_cast<long long>(done));
    }
    return false;
  }

  // The model the run reports on, in the run folder for tern export and your own evaluation.
  void KeepFinalModel(const std::vector<ParamTensor>& layout, const std::vector<float>& x) {
    absl::StatusOr<v1::TensorBundle> b = FlatToBundle(layout, x);
    absl::Status w =
        b.ok() ? WriteFileAtomically(cluster_.dir() + "/final-model.pb", b->SerializeAsString())
               : b.status();
    if (!w.ok()) std::fprintf(stderr, "\ntern run: final model: %s\n", w.ToString().c_str());
  }

  // Every round in order while the server still keeps its model (the last few), so a fast run
  // still has one point per round, each with the counters of its close.
  void EvaluateRounds(int64_t done) {
    const Model& model = *eval_.model;
    const TrainTest& data = eval_.data;
    for (int64_t r = std::max<int64_t>(evaluated_ + 1, 1); r <= done; ++r) {
      v1::ServerStatus rs;
      auto x = FetchGlobalModel(*stub_, r, model.Layout(), codecs_, &rs);
      if (!x.has_value()) {
        if (r == done) break;  // try again on the next pass
        evaluated_ = r;        // an older round no longer kept: skipped
        continue;
      }
      const EvalResult ev =
          model.Evaluate(*x, data.test.features.data(), data.test.labels.data(), data.test.size());
      if (r == run_.rounds) KeepFinalModel(model.Layout(), *x);
      evaluated_ = r;
      last_acc_ = ev.accuracy;
      best_acc_ = std::max(best_acc_, ev.accuracy);
      last_ = rs;
      v1::MetricsRow row = RoundRow(run_, r, rs, ev, start_);
      if (!edge_stubs_.empty()) {
        edges_last_ = EdgesStatus();
        row.set_edge_mb_up(static_cast<float>(edges_last_.payload_bytes_up() / 1e6));
        row.set_edge_mb_down(static_cast<float>(edges_last_.payload_bytes_down() / 1e6));
      }
      cluster_.AppendMetrics(row);
      std::printf(
          "%sround %lld/%d [%s] | %u updates | train loss %.3f | acc %.2f%% | up %.2f MB | "
          "down %.2f MB | %u clients | %.0fs\n",
          tty_ ? "\r\033[K" : "", static_cast<long long>(r), run_.rounds,
          ProgressBar(static_cast<double>(r) / run_.rounds).c_str(), rs.last_round_updates(),
          rs.train_loss(), 100 * ev.accuracy, row.payload_mb_up(), row.payload_mb_down(),
          rs.clients_alive(), row.wall_s());
      std::fflush(stdout);
    }
  }

  void DrawLiveLine(int64_t done, const v1::ServerStatus& st) {
    if (!tty_ || absl::Now() - last_draw_ <= absl::Milliseconds(500)) return;
    std::printf("\r\033[Kround %lld/%d in progress%s | %u clients alive | %.0fs",
                static_cast<long long>(done + 1), run_.rounds,
                done == 0 && !st.round_open() ? " (waiting for clients)" : "", st.clients_alive(),
                absl::ToDoubleSeconds(absl::Now() - start_));
    std::fflush(stdout);
    last_draw_ = absl::Now();
  }

  LocalCluster& cluster_;
  const FedRun& run_;
  ChildProcess* const server_;
  const std::vector<ChildProcess*> groups_;
  const std::vector<ChildProcess*> edges_;
  const int port_;  // the server's, kept across a restart (the clients know that address)
  const std::string address_;
  std::vector<int> edge_ports_;  // likewise
  std::vector<std::unique_ptr<v1::Aggregator::Stub>> edge_stubs_;
  v1::ServerStatus edges_last_;
  bool edge_killed_ = false;                 // killed and not yet restarted
  bool edge_was_killed_ = false;             // once a run
  uint64_t edge_round_seen_ = ~uint64_t{0};  // the edge round whose start the next two hold
  uint64_t edge_accepted_at_open_ = 0;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
  const EvalSetup& eval_;
  const CodecRegistry& codecs_;
  const bool tty_ = isatty(1) != 0;
  const absl::Time start_ = absl::Now();
  absl::Time last_draw_ = absl::InfinitePast();
  int64_t evaluated_ = -1;
  double last_acc_ = 0;
  double best_acc_ = 0;
  v1::ServerStatus last_;
  bool server_killed_ = false;
  std::string stop_reason_;
};

}  // namespace

absl::Status CheckFederatedRunFlags() {
  FedRun run;
  return CheckFedFlags(NewBuiltinServerRegistries(), &run);
}

int RunFederatedMain(const std::string& self_exe) {
  const ServerRegistries registries = NewBuiltinServerRegistries();
  FedRun run;
  if (absl::Status s = CheckFedFlags(registries, &run); !s.ok()) {
    std::fprintf(stderr, "tern run: %s\n", s.ToString().c_str());
    return 2;
  }
  EvalSetup setup;
  if (int rc = LoadEvalSetup(&setup); rc != 0) return rc;
  setup.data.train = Dataset{};  // only the test split is needed here
  const std::string name = FedRunName(run);
  const std::string dir = MakeRunDir(name);
  if (dir.empty()) return 1;
  LocalCluster cluster(self_exe, dir);
  cluster.WriteConfig(FedConfig(name, run, setup.data));
  std::printf(
      "tern run: %s, %d clients (%d per round), %d rounds, update codec %s, rule %s, %s on %s%s\n",
      run.mode.c_str(), run.n, run.k, run.rounds, absl::GetFlag(FLAGS_update_codec).c_str(),
      absl::GetFlag(FLAGS_rule).c_str(), absl::GetFlag(FLAGS_model).c_str(),
      setup.data.test.source.c_str(), setup.data.synthetic ? " (synthetic)" : "");
  std::printf("run folder: %s\n", dir.c_str());
  std::fflush(stdout);

  ::unlink((dir + "/server.port").c_str());
  ::unlink((dir + "/server.ckpt").c_str());
  for (int e = 0; e < run.edges; ++e) {
    ::unlink(absl::StrCat(dir, "/edge-", e, ".port").c_str());
    ::unlink(absl::StrCat(dir, "/edge-", e, ".ckpt").c_str());
  }
  if (absl::GetFlag(FLAGS_tls)) {
    if (absl::Status s = cluster.UseTls({"server", "clients", "edges"}); !s.ok()) {
      std::fprintf(stderr, "tern run: --tls: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  ChildProcess* server = cluster.Start(
      "server", 0, Concat(ParentArgs(run, dir, 0), cluster.TlsArgs("server")), "server.log");
  absl::StatusOr<std::string> address =
      cluster.WaitForAddress(server, "server.port", absl::Seconds(60), run.server_host);
  if (!address.ok()) {
    if (!cluster.interrupted()) {
      std::fprintf(stderr, "tern run: %s\n", std::string(address.status().message()).c_str());
    }
    cluster.Finish();
    if (cluster.interrupted()) return 130;
    return 1;
  }
  // With edges, each site's clients train with their edge, the edges with the server.
  std::vector<ChildProcess*> edges;
  std::vector<std::string> sites(static_cast<size_t>(run.sites()), *address);
  if (run.edges > 0) sites.clear();
  for (int e = 0; e < run.edges; ++e) {
    edges.push_back(cluster.Start(
        "edge", e, Concat(EdgeArgs(run, dir, e, *address, 0), cluster.TlsArgs("edges")),
        absl::StrCat("edge-", e, ".log"), run.site_netns(e)));
    absl::StatusOr<std::string> a = cluster.WaitForAddress(
        edges.back(), absl::StrCat("edge-", e, ".port"), absl::Seconds(60), run.site_host(e));
    if (!a.ok()) {
      if (!cluster.interrupted()) {
        std::fprintf(stderr, "tern run: %s\n", std::string(a.status().message()).c_str());
      }
      cluster.Finish();
      return cluster.interrupted() ? 130 : 1;
    }
    sites.push_back(*a);
  }
  FedWatch watch(&cluster, run, server, StartClientGroups(cluster, run, sites), *address, edges,
                 run.edges > 0 ? sites : std::vector<std::string>{}, &setup,
                 registries.codecs.get());
  watch.Run();
  const bool interrupted = cluster.interrupted();
  const std::vector<std::string> failed = cluster.Failures();
  cluster.Finish();
  if (interrupted) {
    std::printf("\ninterrupted; partial results in %s\n", dir.c_str());
    return 130;
  }
  if (!failed.empty()) {
    std::printf("run failed: %s; see %s/*.log\n", absl::StrJoin(failed, "; ").c_str(), dir.c_str());
    return 1;
  }
  if (!watch.stop_reason().empty()) {
    std::printf("\nthe server ended the run after round %lld: %s\n",
                static_cast<long long>(watch.evaluated()), watch.stop_reason().c_str());
  } else if (watch.evaluated() < run.rounds) {
    std::printf("run did not finish (last round %lld); see %s/*.log\n",
                static_cast<long long>(watch.evaluated()), dir.c_str());
    return 1;
  }
  if (std::string why = UnhealthyRun(std::isfinite(watch.last().train_loss()), watch.last_acc(),
                                     watch.best_acc(), watch.evaluated());
      !why.empty()) {
    std::printf("run failed: %s; see %s/*.log and docs/robustness.md\n", why.c_str(), dir.c_str());
    return 1;
  }
  const v1::ServerStatus& last = watch.last();
  const int rounds_run = static_cast<int>(watch.evaluated());
  std::printf(
      "done: test accuracy %.2f%% after %d rounds; %.2f MB up, %.2f MB down in all "
      "(%.1fx less than dense)\nreport: %s/report.html\n",
      100 * watch.last_acc(), rounds_run, last.payload_bytes_up() / 1e6,
      last.payload_bytes_down() / 1e6,
      static_cast<double>(last.dense_bytes_up() + last.dense_bytes_down()) /
          std::max<double>(
              1, static_cast<double>(last.payload_bytes_up() + last.payload_bytes_down())),
      dir.c_str());
  if (last.dp_clip() > 0) {
    std::printf("differential privacy: epsilon %.3f at delta %g (clip %g, noise multiplier %g)\n",
                last.dp_epsilon(), last.dp_delta(), last.dp_clip(), last.dp_noise());
  }
  if (last.secagg_bytes() > 0) {
    std::printf(
        "secure aggregation: the stages' messages %.2f MB; %llu clients dropped after "
        "masking, %llu rounds without a sum\n",
        static_cast<double>(last.secagg_bytes()) / 1e6,
        static_cast<unsigned long long>(last.secagg_dropped()),
        static_cast<unsigned long long>(last.secagg_failed_rounds()));
  }
  if (run.edges > 0) {
    const v1::ServerStatus& e = watch.edges_last();
    std::printf(
        "edges: %d, each the server's client: %llu updates up (%.2f MB), their clients' %.2f MB "
        "up to them; %llu edge restarts\n",
        run.edges, static_cast<unsigned long long>(e.parent_updates()), e.parent_bytes_up() / 1e6,
        e.payload_bytes_up() / 1e6, static_cast<unsigned long long>(e.restarts()));
  }
  if (last.staleness_size() > 1) {
    double n = 0, sum = 0;
    for (int t = 0; t < last.staleness_size(); ++t) {
      n += static_cast<double>(last.staleness(t));
      sum += t * static_cast<double>(last.staleness(t));
    }
    std::printf("staleness of the accepted updates: mean %.2f, %.0f%% made from an older model\n",
                sum / std::max(1.0, n),
                100 * (1 - static_cast<double>(last.staleness(0)) / std::max(1.0, n)));
  }
  return 0;
}

}  // namespace tern
