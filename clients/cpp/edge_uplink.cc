#include "clients/cpp/edge_uplink.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace tern {

EdgeParticipant::EdgeParticipant(Aggregator* edge, Clock* clock, const std::atomic<bool>* stop,
                                 absl::Duration poll)
    : edge_(edge), clock_(clock), stop_(stop), poll_(poll) {}

absl::Status EdgeParticipant::AwaitModel() {
  bool said = false;
  while (!stop_->load()) {
    layout_ = edge_->layout();
    if (!layout_.empty()) return absl::OkStatus();
    if (!said) {
      spdlog::info("edge: waiting for a client to bring the model before joining the parent");
      said = true;
    }
    clock_->SleepFor(poll_);
  }
  return absl::CancelledError("stopped");
}

absl::Status EdgeParticipant::InitialModel(absl::Span<float> x) {
  const std::vector<float> m = edge_->model();
  if (m.size() != x.size()) return absl::FailedPreconditionError("the edge has no model");
  std::copy(m.begin(), m.end(), x.begin());
  return absl::OkStatus();
}

absl::StatusOr<WorkResult> EdgeParticipant::Work(const v1::Task& task,
                                                 const std::vector<float>& global,
                                                 const WorkContext& context) {
  if (!task.has_local()) {
    return absl::InvalidArgumentError(
        "an edge aggregator trains for federated or local-sgd parents; this parent's task is a "
        "gradient step (ps)");
  }
  const absl::Time started = clock_->Now();
  const uint32_t crc = Crc32(global.data(), 4 * global.size());
  Aggregator::EdgeProgress p = edge_->Edge(false);
  if (p.active && p.parent_round == static_cast<int64_t>(task.round()) && p.base_crc == crc) {
    spdlog::info("edge: parent round {}: resuming its rounds from the checkpoint", task.round());
  } else {
    TERN_RETURN_IF_ERROR(edge_->Rebase(static_cast<int64_t>(task.round()), context.client_id,
                                       task.total_rounds(), global, task.local().lr()));
    spdlog::debug(
        "edge: parent round {}: rounds of its clients from the parent's model, at its rate {:g}",
        task.round(), task.local().lr());
  }
  while (!stop_->load()) {
    p = edge_->Edge(true);
    if (p.ready) {
      WorkResult w;
      w.update = std::move(p.update);
      w.loss = p.loss;
      w.batch = static_cast<uint32_t>(std::lround(p.batch));
      w.weight = p.weight;
      w.seconds = absl::ToDoubleSeconds(clock_->Now() - started);
      examples_ = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(p.weight)));
      return w;
    }
    clock_->SleepFor(poll_);
  }
  return absl::CancelledError("stopped");
}

absl::Status RunEdgeUplink(Aggregator* edge, const std::string& parent, const TlsFiles& tls,
                           AggregatorClientOptions options, const std::atomic<bool>& stop) {
  RealClock clock;
  EdgeParticipant participant(edge, &clock, &stop);
  if (absl::Status s = participant.AwaitModel(); !s.ok()) {
    return stop.load() ? absl::OkStatus() : s;
  }
  if (options.client_id < 0) options.client_id = edge->Edge(false).parent_client;
  options.on_traffic = [edge](uint64_t up, uint64_t down, bool accepted) {
    edge->CountParentTraffic(up, down, accepted);
  };
  spdlog::info("edge: joining the parent at {}{}", parent,
               options.client_id >= 0 ? absl::StrCat(" as client ", options.client_id) : "");
  absl::StatusOr<FedClientStats> stats =
      RunAggregatorClient(parent, tls, options, &participant, stop);
  if (stop.load()) return absl::OkStatus();
  if (!stats.ok()) return stats.status();
  spdlog::info("edge: the parent's run is over; so is this edge's");
  return edge->Finish();
}

}  // namespace tern
