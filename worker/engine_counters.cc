#include "worker/engine_counters.h"

#include <algorithm>

namespace tern {

v1::WorkerStats StatsDelta(const v1::WorkerStats& a, const v1::WorkerStats& b) {
  v1::WorkerStats d;
  d.set_worker_id(a.worker_id());
  d.set_steps(a.steps() - b.steps());
  d.set_rounds(a.rounds() - b.rounds());
  d.set_payload_bytes_sent(a.payload_bytes_sent() - b.payload_bytes_sent());
  d.set_wire_bytes_sent(a.wire_bytes_sent() - b.wire_bytes_sent());
  d.set_payload_bytes_received(a.payload_bytes_received() - b.payload_bytes_received());
  d.set_wire_bytes_received(a.wire_bytes_received() - b.wire_bytes_received());
  d.set_dense_bytes_sent(a.dense_bytes_sent() - b.dense_bytes_sent());
  d.set_compute_seconds(a.compute_seconds() - b.compute_seconds());
  d.set_encode_seconds(a.encode_seconds() - b.encode_seconds());
  d.set_wait_seconds(a.wait_seconds() - b.wait_seconds());
  d.set_transfer_seconds(a.transfer_seconds() - b.transfer_seconds());
  d.set_combine_seconds(a.combine_seconds() - b.combine_seconds());
  d.set_decode_seconds(a.decode_seconds() - b.decode_seconds());
  d.set_step_seconds(a.step_seconds() - b.step_seconds());
  d.set_trainer_io_seconds(a.trainer_io_seconds() - b.trainer_io_seconds());
  d.set_loss_sum(a.loss_sum() - b.loss_sum());
  d.set_messages_refused(a.messages_refused() - b.messages_refused());
  d.set_neighbours_dropped(a.neighbours_dropped() - b.neighbours_dropped());
  d.set_contributions_clipped(a.contributions_clipped() - b.contributions_clipped());
  d.set_group_model_mismatches(a.group_model_mismatches() - b.group_model_mismatches());
  d.set_group_model_repairs(a.group_model_repairs() - b.group_model_repairs());
  d.set_public_copies_resynced(a.public_copies_resynced() - b.public_copies_resynced());
  d.set_local_steps(a.local_steps());  // levels, not counts
  d.set_fragments(a.fragments());
  d.set_local_steps_changes(a.local_steps_changes() - b.local_steps_changes());
  return d;
}

EngineCounters::EngineCounters(int worker_id) {
  stats_.set_worker_id(static_cast<uint32_t>(worker_id));
}

void EngineCounters::AddSeconds(Seconds get, SetSeconds set, double seconds, double decode) {
  absl::MutexLock lock(&mu_);
  (stats_.*set)((stats_.*get)() + seconds);
  if (decode > 0) stats_.set_decode_seconds(stats_.decode_seconds() + decode);
}

void EngineCounters::CountRound(const InFlight& r, const RoundReport& report,
                                std::pair<int, int> peers_up) {
  absl::MutexLock lock(&mu_);
  peers_up_ = peers_up;
  for (const auto& [j, s] : report.results) {
    if (!s.ok()) continue;
    PeerTraffic& t = peer_traffic_[j];
    ++t.messages_sent;
    t.wire_bytes_sent += r.wire;
  }
  stats_.set_payload_bytes_sent(stats_.payload_bytes_sent() + r.payload * report.sent_to);
  stats_.set_wire_bytes_sent(stats_.wire_bytes_sent() + r.wire * report.sent_to);
  stats_.set_dense_bytes_sent(stats_.dense_bytes_sent() + r.dense * report.sent_to);
  stats_.set_wait_seconds(stats_.wait_seconds() + report.wait_seconds);
  stats_.set_transfer_seconds(stats_.transfer_seconds() + report.transfer_seconds);
  stats_.set_neighbours_dropped(stats_.neighbours_dropped() + report.dropped.size());
}

void EngineCounters::CountReceived(int sender, uint64_t payload, uint64_t wire) {
  absl::MutexLock lock(&mu_);
  stats_.set_payload_bytes_received(stats_.payload_bytes_received() + payload);
  stats_.set_wire_bytes_received(stats_.wire_bytes_received() + wire);
  if (sender < 0) return;
  PeerTraffic& t = peer_traffic_[sender];
  ++t.messages_received;
  t.wire_bytes_received += wire;
}

void EngineCounters::CountSent(uint64_t payload, uint64_t wire, uint64_t dense) {
  absl::MutexLock lock(&mu_);
  stats_.set_payload_bytes_sent(stats_.payload_bytes_sent() + payload);
  stats_.set_wire_bytes_sent(stats_.wire_bytes_sent() + wire);
  stats_.set_dense_bytes_sent(stats_.dense_bytes_sent() + dense);
}

void EngineCounters::CountDropped() {
  absl::MutexLock lock(&mu_);
  stats_.set_neighbours_dropped(stats_.neighbours_dropped() + 1);
}

void EngineCounters::CountGroupMismatches(uint64_t n) {
  absl::MutexLock lock(&mu_);
  stats_.set_group_model_mismatches(stats_.group_model_mismatches() + n);
}

void EngineCounters::CountGroupRepair() {
  absl::MutexLock lock(&mu_);
  stats_.set_group_model_repairs(stats_.group_model_repairs() + 1);
}

void EngineCounters::SetClipped(uint64_t total) {
  absl::MutexLock lock(&mu_);
  stats_.set_contributions_clipped(total);
}

void EngineCounters::SetSchedule(int64_t h, int64_t fragments) {
  absl::MutexLock lock(&mu_);
  stats_.set_local_steps(static_cast<uint64_t>(h));
  stats_.set_fragments(static_cast<uint64_t>(fragments));
}

void EngineCounters::CountScheduleChange(int64_t h, int64_t fragments) {
  absl::MutexLock lock(&mu_);
  stats_.set_local_steps(static_cast<uint64_t>(h));
  stats_.set_fragments(static_cast<uint64_t>(fragments));
  stats_.set_local_steps_changes(stats_.local_steps_changes() + 1);
}

void EngineCounters::SetCopiesResynced(uint64_t total) {
  absl::MutexLock lock(&mu_);
  stats_.set_public_copies_resynced(total);
}

void EngineCounters::CountRefused(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  stats_.set_messages_refused(stats_.messages_refused() + 1);
  ++refusals_[absl::StatusCodeToString(why.code())];
}

v1::WorkerStats EngineCounters::EndStep(bool communicated, float loss, double compute_seconds,
                                        double io_seconds) {
  absl::MutexLock lock(&mu_);
  stats_.set_steps(stats_.steps() + 1);
  if (communicated) stats_.set_rounds(stats_.rounds() + 1);
  stats_.set_loss_sum(stats_.loss_sum() + loss);
  stats_.set_compute_seconds(stats_.compute_seconds() + compute_seconds);
  stats_.set_trainer_io_seconds(stats_.trainer_io_seconds() + std::max(0.0, io_seconds));
  const absl::Time now = absl::Now();
  if (last_step_end_ != absl::InfinitePast()) {
    stats_.set_step_seconds(stats_.step_seconds() + absl::ToDoubleSeconds(now - last_step_end_));
  }
  last_step_end_ = now;
  v1::WorkerStats delta = StatsDelta(stats_, last_step_stats_);
  last_step_stats_ = stats_;
  return delta;
}

v1::WorkerStats EngineCounters::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::map<int, EngineCounters::PeerTraffic> EngineCounters::PeerStats() const {
  absl::MutexLock lock(&mu_);
  return peer_traffic_;
}

std::map<std::string, uint64_t> EngineCounters::RefusalsByReason() const {
  absl::MutexLock lock(&mu_);
  return refusals_;
}

std::pair<int, int> EngineCounters::PeersUp() const {
  absl::MutexLock lock(&mu_);
  return peers_up_;
}

}  // namespace tern
