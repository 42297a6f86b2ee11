// Whom one worker mixes with in a round, and with what weights: the topology's graph at that
// round and this worker's row of its mixing matrix (for a static topology, worked out once).
//
// Thread-safety: Round() only from the round loop; topology() from any thread (a Topology's
// GraphFor is const and thread-safe).
#ifndef TERN_WORKER_ROUND_GRAPH_H_
#define TERN_WORKER_ROUND_GRAPH_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/topology/topology.h"

namespace tern {

class RoundGraph {
 public:
  RoundGraph(std::unique_ptr<Topology> topology, WeightRule weights, int worker_id, int num_workers)
      : topology_(std::move(topology)),
        weights_(weights),
        worker_id_(worker_id),
        num_workers_(num_workers) {}

  struct Round {
    std::vector<int> neighbours;
    MixingRow row;  // this worker's weights over itself and them
  };
  absl::StatusOr<Round> At(int64_t round);
  const Topology* topology() const { return topology_.get(); }

 private:
  const std::unique_ptr<Topology> topology_;
  const WeightRule weights_;
  const int worker_id_, num_workers_;
  std::optional<MixingRow> static_row_;  // a static topology's row, once worked out
};

}  // namespace tern

#endif  // TERN_WORKER_ROUND_GRAPH_H_
