#include "worker/round_graph.h"

#include "common/status_macros.h"

namespace tern {

absl::StatusOr<RoundGraph::Round> RoundGraph::At(int64_t round) {
  TERN_ASSIGN_OR_RETURN(Graph g, topology_->GraphFor(num_workers_, round));
  Round r;
  r.neighbours = g.neighbours[worker_id_];
  if (static_row_.has_value()) {
    r.row = *static_row_;
    return r;
  }
  TERN_ASSIGN_OR_RETURN(std::vector<MixingRow> rows, MixingWeights(g, weights_));
  r.row = rows[worker_id_];
  if (topology_->IsStatic()) static_row_ = r.row;
  return r;
}

}  // namespace tern
