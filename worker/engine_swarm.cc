// RoundEngine's SwarmSGD half: an asynchronous algorithm has no rounds. Each step swaps models
// with one neighbour (RunSwap) and answers the neighbours who swap with it (HandleSwap); what
// they leave is averaged in at the next step (ApplyMerges). The rest of the engine is in
// engine.cc.
#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "spdlog/spdlog.h"
#include "worker/engine.h"
#include "worker/gossip_bundle.h"

namespace tern {
namespace {

// An even average of our model with neighbour `j`'s.
MixingRow HalfAndHalf(int j) {
  MixingRow row;
  row.self = 0.5;
  row.neighbours = {{j, 0.5}};
  return row;
}

}  // namespace

absl::StatusOr<v1::TensorBundle> RoundEngine::HandleSwap(v1::TensorBundle bundle,
                                                         uint64_t wire_bytes) {
  uint64_t num_params;
  {
    absl::MutexLock lock(&mu_);
    num_params = registered_.num_params;
  }
  absl::StatusOr<v1::TensorBundle> reply = [&]() -> absl::StatusOr<v1::TensorBundle> {
    if (!asynchronous_) {
      return absl::FailedPreconditionError(
          absl::StrCat(options_.algorithm, " runs in rounds; use Gossip.Push"));
    }
    TERN_ASSIGN_OR_RETURN(auto checked,
                          arrival_.Check(ReceivedBundle{std::move(bundle), {}}, 0, num_params));
    const uint64_t payload = checked.second.PayloadBytes();
    TERN_ASSIGN_OR_RETURN(std::shared_ptr<const v1::TensorBundle> ours,
                          swarm_.Exchange(std::move(checked)));
    v1::TensorBundle out = *ours;
    counters_.CountReceived(-1, payload, wire_bytes);
    counters_.CountSent(PayloadBytes(out), out.ByteSizeLong(), 4 * num_params);
    return out;
  }();
  if (!reply.ok() && !absl::IsUnavailable(reply.status())) CountRefused(reply.status());
  return reply;
}

absl::Status RoundEngine::ApplyMerges() {
  for (const auto& [j, msg] : swarm_.Take()) {
    TERN_RETURN_IF_ERROR(lanes_[0].algorithm->Combine(HalfAndHalf(j), {{j, &msg}}));
  }
  return absl::OkStatus();
}

absl::Status RoundEngine::Publish(int64_t step) {
  TERN_ASSIGN_OR_RETURN(GossipMessage msg, lanes_[0].algorithm->Publish(step));
  swarm_.Publish(std::make_shared<const v1::TensorBundle>(
      GossipToBundle(std::move(msg), options_.run_id, step, options_.worker_id)));
  return absl::OkStatus();
}

absl::Status RoundEngine::RunSwap(int64_t step, GossipMessage msg, StepOutcome* out) {
  const int me = options_.worker_id;
  TERN_ASSIGN_OR_RETURN(Graph g, graph_.topology()->GraphFor(options_.num_workers, step));
  const std::vector<int>& nbrs = g.neighbours[me];
  if (nbrs.empty()) return absl::OkStatus();
  // The partner: a reproducible draw from (seed, worker, step).
  const int j = nbrs[Mix64(options_.algorithm_options.seed ^
                           Mix64((static_cast<uint64_t>(me) << 40) ^ static_cast<uint64_t>(step))) %
                     nbrs.size()];
  TERN_ASSIGN_OR_RETURN(Outgoing o, Pack(step, 0, std::move(msg)));
  const absl::Time t0 = absl::Now();
  absl::StatusOr<v1::TensorBundle> reply =
      transport_->Swap(j, o.chunks, t0 + options_.round_timeout);
  counters_.AddSeconds(&v1::WorkerStats::transfer_seconds, &v1::WorkerStats::set_transfer_seconds,
                       absl::ToDoubleSeconds(absl::Now() - t0));
  if (reply.ok()) {
    counters_.CountSent(o.payload, o.wire, o.dense);
    counters_.CountReceived(-1, 0, reply->ByteSizeLong());
  }
  absl::StatusOr<std::pair<int, GossipMessage>> theirs =
      reply.ok() ? arrival_.Check(ReceivedBundle{*std::move(reply), {}}, 0, params().size())
                 : absl::StatusOr<std::pair<int, GossipMessage>>(reply.status());
  if (theirs.ok() && theirs->first != j) {
    theirs = absl::InvalidArgumentError(absl::StrCat("worker ", j, " answered as ", theirs->first));
  }
  if (!theirs.ok()) {
    counters_.CountDropped();
    spdlog::warn("worker {}: step {}: swap with {} failed: {}", me, step, j,
                 theirs.status().ToString());
    out->dropped = {j};
    return absl::OkStatus();
  }
  counters_.CountReceived(-1, theirs->second.PayloadBytes(), 0);
  const absl::Time t2 = absl::Now();
  TERN_RETURN_IF_ERROR(lanes_[0].algorithm->Combine(HalfAndHalf(j), {{j, &theirs->second}}));
  out->mixed = {j};
  CountTime(&v1::WorkerStats::combine_seconds, &v1::WorkerStats::set_combine_seconds, t2);
  return absl::OkStatus();
}

}  // namespace tern
