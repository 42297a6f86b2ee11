#include "server/metrics.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tern {

namespace {

void Bytes(const v1::ServerStatus& s, MetricSet& m) {
  const std::pair<const char*, std::pair<double, double>> bytes[] = {
      {"payload", {s.payload_bytes_up(), s.payload_bytes_down()}},
      {"wire", {s.wire_bytes_up(), s.wire_bytes_down()}},
      {"dense", {s.dense_bytes_up(), s.dense_bytes_down()}}};
  for (const auto& [kind, up_down] : bytes) {
    m.Counter("tern_server_bytes_total",
              "Bytes of the tensors exchanged with clients: encoded payload, serialized wire, "
              "or raw fp32 (dense); up is clients to server.",
              up_down.first, {{"direction", "up"}, {"kind", kind}});
    m.Counter("tern_server_bytes_total", "", up_down.second,
              {{"direction", "down"}, {"kind", kind}});
  }
  // An edge aggregator's tier above (tern server --parent); absent elsewhere.
  if (s.parent_round() > 0 || s.parent_bytes_up() + s.parent_bytes_down() > 0) {
    m.Counter("tern_server_parent_bytes_total",
              "An edge's serialized bytes with its parent: up its updates, down the parent's "
              "models.",
              static_cast<double>(s.parent_bytes_up()), {{"direction", "up"}});
    m.Counter("tern_server_parent_bytes_total", "", static_cast<double>(s.parent_bytes_down()),
              {{"direction", "down"}});
    m.Counter("tern_server_parent_updates_total", "An edge's updates its parent accepted.",
              static_cast<double>(s.parent_updates()));
    m.Gauge("tern_server_parent_round", "The parent round an edge works for.",
            static_cast<double>(s.parent_round()));
  }
}

}  // namespace

void CollectAggregatorMetrics(const Aggregator& a, const HistogramCounts& round_seconds,
                              absl::Time now, MetricSet& m) {
  const v1::ServerStatus s = a.Status(now);
  m.Counter("tern_server_rounds_total", "Rounds closed (the global model's version).", s.round());
  m.Gauge("tern_server_total_rounds", "Rounds the run is configured for.", s.total_rounds());
  m.Gauge("tern_server_round_open", "1 while a round is open.", s.round_open() ? 1 : 0);
  m.Gauge("tern_server_round_deadline_seconds",
          "The open (or last) round's deadline: --round_deadline_s, or learned from when replies "
          "arrive (--learned_deadline_k).",
          s.round_deadline_s());
  m.Gauge("tern_server_done", "1 once every round closed.", s.done() ? 1 : 0);
  m.Gauge("tern_server_clients_joined", "Clients that joined this run.", s.clients_joined());
  m.Gauge("tern_server_clients_alive", "Clients heard from within the client timeout.",
          s.clients_alive());
  const std::pair<const char*, uint64_t> updates[] = {{"accepted", s.updates_accepted()},
                                                      {"stale", s.updates_stale()},
                                                      {"dropped", s.updates_dropped()}};
  for (const auto& [verdict, n] : updates) {
    m.Counter("tern_server_updates_total",
              "Client updates by verdict: accepted in time, accepted late with a staleness "
              "weight, or too late to use.",
              n, {{"verdict", verdict}});
  }
  for (int tau = 0; tau < s.staleness_size(); ++tau) {
    m.Counter(
        "tern_server_updates_by_staleness_total",
        "Accepted client updates by staleness: rounds (FedBuff: versions) between the model "
        "an update was made from and the one it joined; the last label counts older ones too.",
        static_cast<double>(s.staleness(tau)), {{"staleness", absl::StrCat(tau)}});
  }
  for (const auto& [reason, n] : a.RefusalsByReason()) {
    m.Counter("tern_server_updates_refused_total", "Client updates refused, by reason.", n,
              {{"reason", reason}});
  }
  Bytes(s, m);
  m.Gauge("tern_server_train_loss", "Weighted mean client loss of the last closed round.",
          s.train_loss());
  m.Gauge("tern_server_lr",
          "The learning rate the last closed round took (--lr_schedule): ps, the server's "
          "step's; else the clients' local rate.",
          s.lr());
  if (s.eval_round() > 0) {
    m.Gauge("tern_server_eval_loss",
            "Federated evaluation (--eval_every): examples-weighted mean loss of the clients' "
            "evaluations of the last evaluated round's model.",
            s.eval_loss());
    m.Gauge("tern_server_eval_accuracy",
            "Federated evaluation: examples-weighted mean accuracy, as eval_loss.",
            s.eval_accuracy());
    m.Gauge("tern_server_eval_round", "The round of the last federated evaluation.",
            static_cast<double>(s.eval_round()));
  }
  if (s.dp_clip() > 0) {
    m.Gauge("tern_server_dp_epsilon",
            "DP-FedAvg: epsilon spent so far at tern_server_dp_delta (RDP accountant).",
            s.dp_epsilon());
    m.Gauge("tern_server_dp_delta", "DP-FedAvg: the delta epsilon is reported at.", s.dp_delta());
    m.Gauge("tern_server_dp_clip",
            "DP-FedAvg: the clip norm the open round's clients get (moves with "
            "--dp_clip_quantile).",
            s.dp_clip());
  }
  m.Counter("tern_server_secagg_dropped_total",
            "Secure aggregation (--secagg): clients whose masked update never came after they "
            "masked it (their masks taken away with their neighbours' shares).",
            static_cast<double>(s.secagg_dropped()));
  m.Counter("tern_server_secagg_failed_rounds_total",
            "Secure aggregation: rounds that closed without a sum (too few clients or shares).",
            static_cast<double>(s.secagg_failed_rounds()));
  m.Counter("tern_server_restarts_total", "Times this run's server resumed from its checkpoint.",
            s.restarts());
  m.Histogram("tern_server_round_seconds",
              "Length of each closed round (from one close to the next).", round_seconds);
  if (s.round_closed_unix_s() > 0) {
    m.Gauge("tern_server_last_round_age_seconds", "Seconds since the last round closed.",
            absl::ToDoubleSeconds(now - absl::FromUnixSeconds(0)) - s.round_closed_unix_s());
  }
  if (const absl::Time c = a.LastCheckpoint(); c != absl::InfinitePast()) {
    m.Gauge("tern_server_checkpoint_age_seconds", "Seconds since the checkpoint was last written.",
            absl::ToDoubleSeconds(now - c));
  }
}

void CollectSchedulerMetrics(const Membership& membership, int waiting, absl::Time now,
                             MetricSet& m) {
  const v1::MembersReply r = membership.Members(now);
  m.Gauge("tern_scheduler_epoch", "The membership epoch (one more per change of the live set).",
          r.epoch());
  m.Gauge("tern_scheduler_members", "Live members.", r.members_size());
  m.Counter("tern_scheduler_failures_total", "Members declared dead.",
            membership.failures_declared());
  m.Gauge("tern_scheduler_waiting_calls", "Long polls (GetView, Barrier) waiting now.", waiting);
  double furthest = 0;
  for (const v1::Member& w : r.members()) furthest = std::max<double>(furthest, w.round());
  m.Gauge("tern_scheduler_furthest_round", "The furthest round a live member reported.", furthest);
}

}  // namespace tern
