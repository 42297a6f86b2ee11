#include "worker/metrics.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "worker/link_tuner.h"

namespace tern {

namespace {

void Traffic(const RoundEngine& e, const MetricLabels& base, MetricSet& m) {
  for (const auto& [peer, t] : e.counters().PeerStats()) {
    MetricLabels l = base;
    l.emplace_back("peer", absl::StrCat(peer));
    m.Counter("tern_worker_peer_messages_sent_total",
              "Gossip messages this worker pushed that the peer accepted.", t.messages_sent, l);
    m.Counter("tern_worker_peer_wire_bytes_sent_total",
              "Serialized bytes of the gossip messages the peer accepted.", t.wire_bytes_sent, l);
    m.Counter("tern_worker_peer_messages_received_total",
              "Gossip messages from the peer this worker accepted.", t.messages_received, l);
    m.Counter("tern_worker_peer_wire_bytes_received_total",
              "Serialized bytes of the peer's gossip messages this worker accepted.",
              t.wire_bytes_received, l);
  }
}

void TimeSplit(const v1::WorkerStats& s, const MetricLabels& base, MetricSet& m) {
  const std::pair<const char*, double> parts[] = {
      {"compute", s.compute_seconds()},      {"encode", s.encode_seconds()},
      {"decode", s.decode_seconds()},        {"wait", s.wait_seconds()},
      {"transfer", s.transfer_seconds()},    {"combine", s.combine_seconds()},
      {"trainer_io", s.trainer_io_seconds()}};
  for (const auto& [part, seconds] : parts) {
    MetricLabels l = base;
    l.emplace_back("part", part);
    m.Counter("tern_worker_step_part_seconds_total",
              "Time spent in each part of the steps (compute is the trainer's).", seconds, l);
  }
  m.Counter("tern_worker_step_seconds_total",
            "Wall time of the steps, end to end (from the second step on).", s.step_seconds(),
            base);
}

}  // namespace

void CollectWorkerMetrics(const RoundEngine& e, const EngineOptions& o, MetricSet& m) {
  const v1::WorkerStats s = e.Stats();
  const MetricLabels base = {{"run", o.run_id}, {"worker", absl::StrCat(o.worker_id)}};
  MetricLabels coded = base;
  coded.emplace_back("algorithm", o.algorithm);
  coded.emplace_back("codec", o.algorithm_options.codec);
  m.Gauge("tern_worker_ready", "1 once a trainer registered the model (the worker can train).",
          e.initialized() ? 1 : 0, base);
  m.Counter("tern_worker_steps_total", "Training steps completed.", s.steps(), base);
  m.Counter("tern_worker_rounds_total", "Gossip rounds completed.", s.rounds(), base);
  const std::pair<const char*, std::pair<double, double>> bytes[] = {
      {"payload", {s.payload_bytes_sent(), s.payload_bytes_received()}},
      {"wire", {s.wire_bytes_sent(), s.wire_bytes_received()}},
      {"dense", {s.dense_bytes_sent(), 0}}};
  for (const auto& [kind, sent_received] : bytes) {
    MetricLabels l = coded;
    l.emplace_back("kind", kind);
    m.Counter("tern_worker_bytes_sent_total",
              "Bytes of the messages sent: encoded payload, serialized wire, or raw fp32 (dense).",
              sent_received.first, l);
    if (std::string(kind) != "dense") {
      m.Counter("tern_worker_bytes_received_total", "Bytes of the messages accepted.",
                sent_received.second, l);
    }
  }
  Traffic(e, base, m);
  TimeSplit(s, base, m);
  for (const auto& [reason, n] : e.counters().RefusalsByReason()) {
    MetricLabels l = base;
    l.emplace_back("reason", reason);
    m.Counter("tern_worker_messages_refused_total", "Incoming gossip messages refused, by reason.",
              n, l);
  }
  if (const LinkTuner* tuner = e.link_tuner(); tuner != nullptr) {
    const LinkState link = tuner->Snapshot();
    MetricLabels l = base;
    l.emplace_back("codec", link.codec);
    m.Gauge("tern_worker_link_codec",
            "1 for the codec this worker's updates go out in now (--codec_ladder).", 1, l);
    m.Counter("tern_worker_link_codec_changes_total",
              "Times the link's measure moved the updates to another codec.",
              static_cast<double>(link.changes), base);
    m.Gauge("tern_worker_link_compute_utilization",
            "The last window's share of step time not spent waiting (--cu_target's measure).",
            link.cu, base);
    m.Gauge("tern_worker_link_push_seconds",
            "The last window's mean time to push one update to every peer.", link.push_seconds,
            base);
    m.Gauge("tern_worker_link_megabytes_per_second",
            "One update's bytes over its push time, the last window's.", link.megabytes_per_second,
            base);
  }
  m.Counter("tern_worker_neighbours_dropped_total",
            "(round, neighbour) pairs left out of the mixing (no message by the deadline).",
            s.neighbours_dropped(), base);
  m.Counter("tern_worker_contributions_clipped_total",
            "Neighbours' contributions scaled down to the clipping radius (--gossip_clip).",
            s.contributions_clipped(), base);
  m.Counter("tern_worker_group_model_mismatches_total",
            "diloco: (round, neighbour) pairs whose group model was not this worker's, byte for "
            "byte (the CRC its message carries).",
            s.group_model_mismatches(), base);
  m.Counter("tern_worker_group_model_repairs_total",
            "diloco: the group model taken again from peers whose model most workers of a round "
            "held, this worker's not.",
            s.group_model_repairs(), base);
  m.Counter("tern_worker_public_copies_resynced_total",
            "CHOCO: neighbours' public copies taken whole after one missed a message (each a "
            "model's fp32 bytes on the wire).",
            s.public_copies_resynced(), base);
  if (const StepsTuner* steps = e.steps_tuner(); steps != nullptr) {
    const StepsState st = steps->Snapshot();
    m.Gauge("tern_worker_local_steps",
            "diloco with --local_steps_max: the steps between exchanges (H) the group runs now.",
            static_cast<double>(s.local_steps()), base);
    m.Counter("tern_worker_local_steps_changes_total",
              "diloco with --local_steps_max: moves of H (and of the fragment count) the group "
              "agreed (each lane's counted).",
              s.local_steps_changes(), base);
    m.Gauge("tern_worker_local_steps_proposed",
            "diloco with --local_steps_max: the H this worker proposes from its link (0 before "
            "its first window).",
            static_cast<double>(st.proposed), base);
    m.Gauge("tern_worker_local_steps_need",
            "diloco with --local_steps_max: the H --cu_target needs as this worker measured its "
            "link (smoothed), before rounding and the range.",
            st.need, base);
    if (st.fragments > 0 || s.fragments() > 0) {
      m.Gauge("tern_worker_fragments",
              "diloco with --fragments_min: the fragment count (turns the lanes take a period) "
              "the group runs now.",
              static_cast<double>(s.fragments()), base);
      m.Gauge("tern_worker_fragments_proposed",
              "diloco with --fragments_min: the fragment count this worker proposes from its "
              "link (0 before its first window).",
              static_cast<double>(st.fragments), base);
      m.Gauge("tern_worker_link_round_trip_seconds",
              "diloco with --fragments_min: the fixed cost of an exchange (round trip) as this "
              "worker's link model fits it.",
              st.round_trip_seconds, base);
      m.Gauge("tern_worker_link_bytes_per_second",
              "diloco with --fragments_min: the link's rate as this worker's link model fits it "
              "(0 before two fragment counts were measured).",
              st.bytes_per_second, base);
    }
  }
  const auto [up, of] = e.counters().PeersUp();
  m.Gauge("tern_worker_peers_up", "Neighbours of the last round believed up.", up, base);
  m.Gauge("tern_worker_peers", "Neighbours in the last round's graph.", of, base);
  m.Gauge("tern_worker_next_step", "The step this worker runs next.", e.next_step(), base);
}

void CollectAuthMetrics(const CallAuthenticator& authenticator, const EngineOptions& o,
                        MetricSet& m) {
  m.CountersByReason("tern_worker_calls_unauthenticated_total", kUnauthenticatedCallsHelp,
                     authenticator.RefusalsByReason(),
                     {{"run", o.run_id}, {"worker", absl::StrCat(o.worker_id)}});
}

}  // namespace tern
