// Gossip topologies and their mixing weights (ALGORITHMS.md §2).
//
// A Topology says, for n workers and a round t, who talks to whom: an undirected graph, possibly
// different each round (one-peer exponential, random matching). MixingWeights turns a graph into
// the symmetric, doubly stochastic W of the decentralized algorithms. Every worker computes the
// same graph from (n, t, seed) alone, so no coordination is needed to agree on it.
//
// Thread-safety: Topology objects are immutable after construction; all methods are const and
// safe to call concurrently. The registry is not synchronised: fill it, then share it read-only.
#ifndef TERN_CORE_TOPOLOGY_TOPOLOGY_H_
#define TERN_CORE_TOPOLOGY_TOPOLOGY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/registry.h"
#include "common/spec.h"

namespace tern {

// Undirected graph on workers 0..n-1: neighbours[i] is sorted, without i itself, and j is in
// neighbours[i] exactly when i is in neighbours[j].
struct Graph {
  std::vector<std::vector<int>> neighbours;
  int size() const { return static_cast<int>(neighbours.size()); }
  bool IsRegular() const;
};

class Topology {
 public:
  virtual ~Topology() = default;
  virtual std::string Name() const = 0;
  // True when the graph is the same every round.
  virtual bool IsStatic() const = 0;
  // The graph of round `round` for `n` workers (n >= 1).
  virtual absl::StatusOr<Graph> GraphFor(int n, int64_t round) const = 0;
};

// One worker's row of W: its own weight and its neighbours' (same order as the graph).
struct MixingRow {
  double self = 1.0;
  std::vector<std::pair<int, double>> neighbours;
};

enum class WeightRule {
  kAuto,        // uniform on regular graphs, Metropolis-Hastings otherwise
  kUniform,     // 1/(deg+1): doubly stochastic only on regular graphs (checked)
  kMetropolis,  // w_ij = 1/(1 + max(d_i, d_j)), w_ii = 1 - sum: doubly stochastic on any graph
};
absl::StatusOr<WeightRule> ParseWeightRule(absl::string_view name);

// The full W as rows (row i is worker i's). Errors on kUniform over a non-regular graph.
absl::StatusOr<std::vector<MixingRow>> MixingWeights(const Graph& g, WeightRule rule);

// Row i after neighbours in `dropped` went silent this round: their weight moves to the self
// weight, so the row still sums to 1 (and W stays symmetric when the silence is mutual, as it is
// for a dead peer).
MixingRow DropNeighbours(const MixingRow& row, const std::vector<int>& dropped);

// The base topology over the workers that are members in a round (a scheduler's view), ranked
// by id and mapped back to worker ids; a worker that is not a member has no neighbours. So a
// dead worker's neighbours get new ones (the graph is repaired) from the round the scheduler
// names. `members(round)` returns sorted ids, or nullopt for every worker (static config).
// Thread-safety: as thread-safe as `members`.
class MemberTopology final : public Topology {
 public:
  using MembersFn = std::function<std::optional<std::vector<int>>(int64_t round)>;
  MemberTopology(std::unique_ptr<Topology> base, MembersFn members)
      : base_(std::move(base)), members_(std::move(members)) {}
  std::string Name() const override { return base_->Name() + "+members"; }
  bool IsStatic() const override { return false; }
  absl::StatusOr<Graph> GraphFor(int n, int64_t round) const override;

 private:
  const std::unique_ptr<Topology> base_;
  const MembersFn members_;
};

// Topologies by spec "name[:key=value,...]": ring, torus, exponential, one-peer-exponential,
// random-matching (key seed), complete.
using TopologyRegistry = Registry<Topology>;

// A registry holding every built-in topology.
std::unique_ptr<TopologyRegistry> NewBuiltinTopologyRegistry();

}  // namespace tern

#endif  // TERN_CORE_TOPOLOGY_TOPOLOGY_H_
