#include "cli/aggregator_flags.h"

#include <algorithm>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "clients/flags/limit_flags.h"
#include "clients/flags/service_flags.h"
#include "clients/flags/train_flags.h"
#include "common/status_macros.h"

ABSL_DECLARE_FLAG(std::string, checkpoint);       // tern server's (server_cmd.cc)
ABSL_DECLARE_FLAG(bool, fresh_start_if_damaged);  // tern server's (server_cmd.cc)
ABSL_DECLARE_FLAG(std::string, lr_schedule);      // clients/flags/task_flags.cc
ABSL_DECLARE_FLAG(std::string, parent);           // tern server's (server_cmd.cc)

ABSL_FLAG(std::string, mode, "",
          "run: gossip (peer workers; the default) | federated | local-sgd | ps | fedbuff (a "
          "server and clients); server: federated (the default) | local-sgd | ps | fedbuff "
          "(no rounds: --concurrency clients train at once, every --buffer updates one step)");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, rounds, 50, "server/run: rounds of the run");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, clients_per_round, 10,
          "server/run: K, clients sampled per federated round");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, min_clients, 0,
          "server/run: clients that must have joined before round 1 (0: all of --clients in a "
          "run, 1 for a bare server)");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, min_replies, 0,
          "server/run: a round may close after this many replies (0: K)");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, grace_s, 1,
          "server/run: seconds a round stays open after its min replies");
ABSL_FLAG(tern::Double<tern::Above(0)>, round_deadline_s, 60,
          "server/run: seconds after which a round closes");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, learned_deadline_k, 0,
          "server/run: deadlines that learn: a round's deadline is the recent replies' median "
          "arrival + K spreads (1.4826 MAD), within [--deadline_floor_s, --round_deadline_s] "
          "(0: --round_deadline_s always)");
ABSL_FLAG(tern::Double<tern::Above(0)>, deadline_floor_s, 1,
          "server/run: the least a learned deadline may be (--learned_deadline_k)");
ABSL_FLAG(tern::Double<tern::In(0, 1)>, staleness_decay, 0,
          "server/run: late updates keep weight decay^age (0: late updates are dropped)");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, max_staleness, 2,
          "server/run: oldest round (in rounds) a late update may be for");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, buffer, 10,
          "server/run, mode fedbuff: K, the updates (of any version) that make one server step");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, concurrency, 0,
          "server/run, mode fedbuff: C, the most clients training at once (0: every client)");
ABSL_FLAG(std::string, staleness, "poly:a=0.5",
          "server/run, mode fedbuff: s(tau), what an update tau versions old is multiplied by: "
          "poly:a=A ((1 + tau)^-A; A = 0.5 is FedBuff's 1/sqrt(1 + tau)) | hinge:a=A,b=B | const; "
          "each with ,max=M (older ones dropped)");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, edge_rounds, 1,
          "server/run: an edge aggregator's (tern server --parent, tern run --edges) rounds of its "
          "own clients for each task of its parent; its update to the parent is the change they "
          "made");
ABSL_FLAG(std::string, sampling, "uniform", "server/run: client sampling: uniform | score");
ABSL_FLAG(std::string, rule, "fedavg",
          "server/run: fedavg | median | trimmed-mean:trim=T | krum:f=F | multi-krum:f=F,m=M | "
          "majority-vote (ps: signSGD's vote, signs up and 1 bit down), any with ,clip=C");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, server_lr, 1.0,
          "server/run: outer learning rate (x += server_lr * m)");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, dp_clip, 0,
          "server/run: DP-FedAvg: clients clip their update to this L2 norm S, the server refuses "
          "one over it, weighs each alike and adds Gaussian noise of sd dp_noise x S to each "
          "round's sum (0: off; federated or local-sgd, --rule=fedavg)");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, dp_noise, 1.0,
          "server/run: DP-FedAvg's noise multiplier z");
ABSL_FLAG(tern::Double<tern::Open(0, 1)>, dp_delta, 1e-5,
          "server/run: DP-FedAvg: epsilon is reported at this delta");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, dp_clip_quantile, 0,
          "server/run: DP-FedAvg: adaptive clipping (Andrew et al. 2021): after each round the "
          "clip moves towards this quantile of the clients' update norms, --dp_clip its start "
          "(0: the clip stays --dp_clip; 0.5 the median)");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, dp_clip_lr, 0.2,
          "server/run: adaptive clipping's step: clip *= exp(-lr (fraction within - quantile))");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, dp_clip_count_noise, 0,
          "server/run: adaptive clipping: the sd of the Gaussian noise on the count of clients "
          "within the clip, > dp_noise / 2 (0: clients_per_round / 20)");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, dp_epsilon_budget, 0,
          "server/run: DP-FedAvg: the run ends before a round that would take epsilon past this "
          "(0: no budget)");
ABSL_FLAG(bool, secagg, false,
          "server/run: secure aggregation (SecAgg+): each round's clients mask their updates, "
          "quantized to --secagg_bits, with pairwise and self masks, and the server learns only "
          "their unweighted mean, even when some drop after masking (federated or local-sgd, "
          "--rule=fedavg, --update_codec=none; the C++ client)");
ABSL_FLAG(tern::Int<tern::AtLeast(2)>, secagg_neighbours, 16,
          "server/run, --secagg: k, each client's neighbours in the round's masking graph "
          "(rounded up to even; all the others when fewer)");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, secagg_threshold, 0,
          "server/run, --secagg: t, the shares that rebuild a client's secrets (0: more than half "
          "of its neighbours)");
ABSL_FLAG(tern::Int<tern::AtLeast(8)>, secagg_bits, 32,
          "server/run, --secagg: b, the masked integers are mod 2^b (8..32): the bits each "
          "coordinate of an update takes on the wire");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, secagg_levels, 0,
          "server/run, --secagg: Q, each coordinate of an update is rounded onto 0..Q (0: the "
          "most that a round's sum fits in b bits)");
ABSL_FLAG(tern::Double<tern::Above(0)>, secagg_range, 1.0,
          "server/run, --secagg: r, each coordinate of an update is clipped to [-r, r] before it "
          "is quantized");
ABSL_FLAG(tern::Double<tern::Above(0)>, secagg_stage_timeout_s, 30,
          "server/run, --secagg: the most a key, share or reveal stage waits for a round's "
          "clients");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, eval_every, 0,
          "server/run: federated evaluation: every N rounds (and the last) the clients evaluate "
          "the model they train from on held-out data; the server logs the examples-weighted "
          "mean (0: never)");
ABSL_FLAG(tern::Double<tern::HalfOpen(0, 1)>, server_momentum, 0.0,
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
          "--update_codec) | momentum[:beta=B] (each client sends its momentum "
          "m = B m + (1 - B) u; Signum with --rule=majority-vote)");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, local_epochs, 1,
          "server/run: local epochs per round (0: --local_steps minibatch steps instead)");
ABSL_FLAG(tern::Double<tern::HalfOpen(0, 1)>, local_momentum, 0.0,
          "server/run: clients' local SGD momentum");
ABSL_FLAG(
    std::string, optimizer, "sgd",
    "server/run (ps): sgd (with --server_momentum) | adam | lamb | onebit-adam | onebit-lamb");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, warmup_rounds, 100,
          "server/run: 1-bit Adam/LAMB's dense warm-up rounds, after which the variance freezes");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, adaptive_batch_eta, 0,
          "server/run: clients' norm test (adaptive batch size for local work): raise the batch "
          "while Var/b > eta^2 ||g||^2 (0: off)");
ABSL_FLAG(tern::Double<tern::In(0, 1)>, overlap_anchor, 0,
          "server/run, mode local-sgd: Overlap-Local-SGD's pull alpha (clients keep their own "
          "models, run the next local steps while the anchor is averaged, then pull "
          "x -= alpha (x - anchor)); 0: plain local SGD");
ABSL_FLAG(tern::Int<tern::In(1, 1048576)>, max_batch, 1024,
          "server/run: the adaptive batch size's cap");
ABSL_FLAG(tern::Double<tern::HalfOpen(0, 1)>, beta1, 0.9, "server/run: Adam's first-moment decay");
ABSL_FLAG(tern::Double<tern::HalfOpen(0, 1)>, beta2, 0.999,
          "server/run: Adam's second-moment decay");
ABSL_FLAG(tern::Double<tern::AboveUpTo(0, 1)>, eps, 1e-8, "server/run: Adam's epsilon");
ABSL_FLAG(tern::Double<tern::Above(0)>, client_timeout_s, 30,
          "server: a client silent this long is not sampled");

namespace tern {

double FedLr() {
  const double lr = absl::GetFlag(FLAGS_lr).value;
  return lr > 0 ? lr : 0.05;
}

namespace {

// The task's work for `mode` from the flags: a gradient step (ps) or local training. A flag
// of the other kind of work is an error rather than silently ignored.
absl::Status SetTaskWork(const std::string& mode, v1::Task* task) {
  const uint32_t batch = static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_batch).value));
  const std::string& optimizer = absl::GetFlag(FLAGS_optimizer);
  if (mode == "ps") {
    if (absl::GetFlag(FLAGS_adaptive_batch_eta).value > 0) {
      return absl::InvalidArgumentError(
          "--adaptive_batch_eta is for local work, not --mode=ps (one minibatch a round)");
    }
    v1::GradientStep* g = task->mutable_gradient();
    g->set_batch(batch);
    g->set_lr(static_cast<float>(FedLr()));
    g->set_optimizer(optimizer);
    g->set_warmup_rounds(
        static_cast<uint64_t>(std::max(0, absl::GetFlag(FLAGS_warmup_rounds).value)));
    g->set_beta1(static_cast<float>(absl::GetFlag(FLAGS_beta1).value));
    g->set_eps(static_cast<float>(absl::GetFlag(FLAGS_eps).value));
    return absl::OkStatus();
  }
  if (!optimizer.empty() && optimizer != "sgd") {
    return absl::InvalidArgumentError(absl::StrCat("--optimizer=", optimizer, " needs --mode=ps"));
  }
  v1::LocalTraining* l = task->mutable_local();
  l->set_local_epochs(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_local_epochs).value)));
  l->set_local_steps(static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_local_steps).value)));
  l->set_batch(batch);
  l->set_lr(static_cast<float>(FedLr()));
  l->set_momentum(static_cast<float>(absl::GetFlag(FLAGS_local_momentum).value));
  l->set_norm_test_eta(static_cast<float>(absl::GetFlag(FLAGS_adaptive_batch_eta).value));
  l->set_max_batch(static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_max_batch).value)));
  l->set_anchor_pull(static_cast<float>(absl::GetFlag(FLAGS_overlap_anchor).value));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServerOptions> ServerOptionsFromFlags() {
  ServerOptions so;
  so.listen = absl::GetFlag(FLAGS_listen);
  AggregatorOptions& a = so.aggregator;
  a.run_id = absl::GetFlag(FLAGS_run_id);
  a.mode = absl::GetFlag(FLAGS_mode).empty() ? "federated" : absl::GetFlag(FLAGS_mode);
  a.min_clients = std::max(1, absl::GetFlag(FLAGS_min_clients).value);
  a.total_rounds = absl::GetFlag(FLAGS_rounds).value;
  a.policy.clients_per_round = absl::GetFlag(FLAGS_clients_per_round).value;
  a.policy.min_replies = absl::GetFlag(FLAGS_min_replies).value > 0
                             ? absl::GetFlag(FLAGS_min_replies).value
                             : a.policy.clients_per_round;
  a.policy.grace = absl::Seconds(absl::GetFlag(FLAGS_grace_s).value);
  a.policy.deadline = absl::Seconds(absl::GetFlag(FLAGS_round_deadline_s).value);
  a.policy.deadline_k = absl::GetFlag(FLAGS_learned_deadline_k).value;
  a.policy.deadline_floor = absl::Seconds(absl::GetFlag(FLAGS_deadline_floor_s).value);
  a.policy.staleness_decay = absl::GetFlag(FLAGS_staleness_decay).value;
  a.policy.max_staleness = absl::GetFlag(FLAGS_max_staleness).value;
  a.policy.buffer = absl::GetFlag(FLAGS_buffer).value;
  a.policy.concurrency = absl::GetFlag(FLAGS_concurrency).value;
  a.staleness = absl::GetFlag(FLAGS_staleness);
  auto sampling = ParseSampling(absl::GetFlag(FLAGS_sampling));
  if (!sampling.ok()) return sampling.status();
  a.policy.sampling = *sampling;
  a.policy.seed = absl::GetFlag(FLAGS_seed);
  a.rule = absl::GetFlag(FLAGS_rule);
  a.server_lr = absl::GetFlag(FLAGS_server_lr).value;
  a.server_momentum = absl::GetFlag(FLAGS_server_momentum).value;
  a.outer = absl::GetFlag(FLAGS_outer);
  a.eval_every = absl::GetFlag(FLAGS_eval_every).value;
  a.downstream = absl::GetFlag(FLAGS_downstream);
  a.downstream_codec = absl::GetFlag(FLAGS_downstream_codec);
  a.task.set_update_codec(absl::GetFlag(FLAGS_update_codec));
  a.task.set_error_feedback(absl::GetFlag(FLAGS_error_feedback));
  a.task.set_memory(absl::GetFlag(FLAGS_memory));
  a.task.set_seed(absl::GetFlag(FLAGS_seed));
  TERN_RETURN_IF_ERROR(SetTaskWork(a.mode, &a.task));
  a.beta2 = static_cast<float>(absl::GetFlag(FLAGS_beta2).value);
  a.lr_schedule = absl::GetFlag(FLAGS_lr_schedule);
  a.client_timeout = absl::Seconds(absl::GetFlag(FLAGS_client_timeout_s).value);
  a.checkpoint_path = absl::GetFlag(FLAGS_checkpoint);
  a.fresh_start_if_damaged = absl::GetFlag(FLAGS_fresh_start_if_damaged);
  if (!absl::GetFlag(FLAGS_parent).empty()) a.edge_rounds = absl::GetFlag(FLAGS_edge_rounds).value;
  a.norm_guard.factor = absl::GetFlag(FLAGS_norm_guard).value;
  a.dp.clip = absl::GetFlag(FLAGS_dp_clip).value;
  a.dp.noise = absl::GetFlag(FLAGS_dp_noise).value;
  a.dp.delta = absl::GetFlag(FLAGS_dp_delta).value;
  a.dp.epsilon_budget = absl::GetFlag(FLAGS_dp_epsilon_budget).value;
  a.dp.clip_quantile = absl::GetFlag(FLAGS_dp_clip_quantile).value;
  a.dp.clip_lr = absl::GetFlag(FLAGS_dp_clip_lr).value;
  a.dp.clip_count_noise = absl::GetFlag(FLAGS_dp_clip_count_noise).value;
  a.secagg.enabled = absl::GetFlag(FLAGS_secagg);
  a.secagg.neighbours = static_cast<uint32_t>(absl::GetFlag(FLAGS_secagg_neighbours).value);
  a.secagg.threshold = static_cast<uint32_t>(absl::GetFlag(FLAGS_secagg_threshold).value);
  a.secagg.bits = static_cast<uint32_t>(absl::GetFlag(FLAGS_secagg_bits).value);
  a.secagg.levels = static_cast<uint32_t>(
      std::min<int64_t>(absl::GetFlag(FLAGS_secagg_levels).value, 0xffffffff));
  a.secagg.range = absl::GetFlag(FLAGS_secagg_range).value;
  a.secagg.stage_timeout = absl::Seconds(absl::GetFlag(FLAGS_secagg_stage_timeout_s).value);
  so.limits = StreamLimitsFromFlags(so.limits);
  so.metrics_listen = MetricsListenFromFlags();
  so.tls = TlsFromFlags();
  return so;
}

}  // namespace tern
