#include "core/topology/topology.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace tern {
namespace {

// Adds the undirected edge {i, j} (ignoring self loops and repeats) to an edge-set graph.
void AddEdge(std::vector<std::vector<int>>& nb, int i, int j) {
  if (i == j) return;
  nb[i].push_back(j);
  nb[j].push_back(i);
}

Graph Finish(std::vector<std::vector<int>> nb) {
  for (auto& row : nb) {
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
  }
  return Graph{std::move(nb)};
}

absl::Status CheckSize(int n) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("topology needs n >= 1, got ", n));
  return absl::OkStatus();
}

class Ring final : public Topology {
 public:
  std::string Name() const override { return "ring"; }
  bool IsStatic() const override { return true; }
  absl::StatusOr<Graph> GraphFor(int n, int64_t) const override {
    TERN_RETURN_IF_ERROR(CheckSize(n));
    std::vector<std::vector<int>> nb(n);
    for (int i = 0; i < n; ++i) AddEdge(nb, i, (i + 1) % n);
    return Finish(std::move(nb));
  }
};

// rows x cols grid with wrap-around; rows is the largest divisor of n not above sqrt(n), so a
// prime n degenerates to a ring.
class Torus final : public Topology {
 public:
  std::string Name() const override { return "torus"; }
  bool IsStatic() const override { return true; }
  absl::StatusOr<Graph> GraphFor(int n, int64_t) const override {
    TERN_RETURN_IF_ERROR(CheckSize(n));
    int rows = static_cast<int>(std::sqrt(static_cast<double>(n)));
    while (n % rows != 0) --rows;
    const int cols = n / rows;
    std::vector<std::vector<int>> nb(n);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const int i = r * cols + c;
        AddEdge(nb, i, r * cols + (c + 1) % cols);
        AddEdge(nb, i, ((r + 1) % rows) * cols + c);
      }
    }
    return Finish(std::move(nb));
  }
};

int CeilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// Static exponential graph: i <-> i + 2^k (mod n) for every 2^k < n.
class Exponential final : public Topology {
 public:
  std::string Name() const override { return "exponential"; }
  bool IsStatic() const override { return true; }
  absl::StatusOr<Graph> GraphFor(int n, int64_t) const override {
    TERN_RETURN_IF_ERROR(CheckSize(n));
    std::vector<std::vector<int>> nb(n);
    for (int i = 0; i < n; ++i) {
      for (int hop = 1; hop < n; hop *= 2) AddEdge(nb, i, (i + hop) % n);
    }
    return Finish(std::move(nb));
  }
};

// One-peer exponential: in round t, i <-> i + 2^(t mod ceil(log2 n)) (mod n).
class OnePeerExponential final : public Topology {
 public:
  std::string Name() const override { return "one-peer-exponential"; }
  bool IsStatic() const override { return false; }
  absl::StatusOr<Graph> GraphFor(int n, int64_t round) const override {
    TERN_RETURN_IF_ERROR(CheckSize(n));
    std::vector<std::vector<int>> nb(n);
    const int levels = CeilLog2(n);
    if (levels > 0) {
      const int hop = 1 << static_cast<int>(round % levels);
      for (int i = 0; i < n; ++i) AddEdge(nb, i, (i + hop) % n);
    }
    return Finish(std::move(nb));
  }
};

// A fresh perfect matching every round (one worker sits out when n is odd), drawn from
// (seed, round) with the counter RNG so every worker derives the same one.
class RandomMatching final : public Topology {
 public:
  explicit RandomMatching(uint64_t seed) : seed_(seed) {}
  std::string Name() const override { return absl::StrCat("random-matching:seed=", seed_); }
  bool IsStatic() const override { return false; }
  absl::StatusOr<Graph> GraphFor(int n, int64_t round) const override {
    TERN_RETURN_IF_ERROR(CheckSize(n));
    std::vector<int> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    const RngKey key = MakeRngKey(seed_, static_cast<uint32_t>(round));
    for (int i = n - 1; i > 0; --i) {  // Fisher-Yates
      const int j =
          static_cast<int>(Random32(key, static_cast<uint64_t>(i)) % static_cast<uint32_t>(i + 1));
      std::swap(perm[i], perm[j]);
    }
    std::vector<std::vector<int>> nb(n);
    for (int i = 0; i + 1 < n; i += 2) AddEdge(nb, perm[i], perm[i + 1]);
    return Finish(std::move(nb));
  }

 private:
  const uint64_t seed_;
};

class Complete final : public Topology {
 public:
  std::string Name() const override { return "complete"; }
  bool IsStatic() const override { return true; }
  absl::StatusOr<Graph> GraphFor(int n, int64_t) const override {
    TERN_RETURN_IF_ERROR(CheckSize(n));
    std::vector<std::vector<int>> nb(n);
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) AddEdge(nb, i, j);
    }
    return Finish(std::move(nb));
  }
};

template <typename T>
TopologyRegistry::Factory NoParams() {
  return [](SpecParams&) -> absl::StatusOr<std::unique_ptr<Topology>> {
    return std::make_unique<T>();
  };
}

}  // namespace

bool Graph::IsRegular() const {
  for (const auto& row : neighbours) {
    if (row.size() != neighbours[0].size()) return false;
  }
  return true;
}

absl::StatusOr<WeightRule> ParseWeightRule(absl::string_view name) {
  if (name == "auto") return WeightRule::kAuto;
  if (name == "uniform") return WeightRule::kUniform;
  if (name == "metropolis") return WeightRule::kMetropolis;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown mixing weights '", name, "' (auto, uniform, metropolis)"));
}

absl::StatusOr<std::vector<MixingRow>> MixingWeights(const Graph& g, WeightRule rule) {
  const bool regular = g.IsRegular();
  if (rule == WeightRule::kUniform && !regular) {
    return absl::InvalidArgumentError(
        "uniform mixing weights need a regular graph (use metropolis or auto)");
  }
  const bool uniform = rule == WeightRule::kUniform || (rule == WeightRule::kAuto && regular);
  std::vector<MixingRow> rows(g.size());
  for (int i = 0; i < g.size(); ++i) {
    const auto& nb = g.neighbours[i];
    MixingRow& row = rows[i];
    double sum = 0;
    for (int j : nb) {
      const double w =
          uniform ? 1.0 / (nb.size() + 1) : 1.0 / (1 + std::max(nb.size(), g.neighbours[j].size()));
      row.neighbours.emplace_back(j, w);
      sum += w;
    }
    row.self = 1.0 - sum;
  }
  return rows;
}

MixingRow DropNeighbours(const MixingRow& row, const std::vector<int>& dropped) {
  MixingRow out;
  out.self = row.self;
  for (const auto& [j, w] : row.neighbours) {
    if (std::find(dropped.begin(), dropped.end(), j) != dropped.end()) {
      out.self += w;
    } else {
      out.neighbours.emplace_back(j, w);
    }
  }
  return out;
}

std::unique_ptr<TopologyRegistry> NewBuiltinTopologyRegistry() {
  auto r = std::make_unique<TopologyRegistry>("topology");
  const std::pair<const char*, TopologyRegistry::Factory> all[] = {
      {"ring", NoParams<Ring>()},
      {"torus", NoParams<Torus>()},
      {"exponential", NoParams<Exponential>()},
      {"one-peer-exponential", NoParams<OnePeerExponential>()},
      {"complete", NoParams<Complete>()},
      {"random-matching",
       [](SpecParams& p) -> absl::StatusOr<std::unique_ptr<Topology>> {
         TERN_ASSIGN_OR_RETURN(int64_t seed, p.Int("seed", 1, 0, int64_t{1} << 62));
         return std::make_unique<RandomMatching>(static_cast<uint64_t>(seed));
       }},
  };
  // Distinct names by construction: Register cannot fail here.
  for (const auto& [name, factory] : all) (void)r->Register(name, factory);
  return r;
}

absl::StatusOr<Graph> MemberTopology::GraphFor(int n, int64_t round) const {
  std::optional<std::vector<int>> ids = members_(round);
  if (!ids.has_value()) return base_->GraphFor(n, round);
  std::vector<int> alive;
  for (int id : *ids) {
    if (id >= 0 && id < n) alive.push_back(id);
  }
  std::sort(alive.begin(), alive.end());
  alive.erase(std::unique(alive.begin(), alive.end()), alive.end());
  Graph g;
  g.neighbours.resize(static_cast<size_t>(n));
  if (alive.empty()) return g;
  TERN_ASSIGN_OR_RETURN(Graph sub, base_->GraphFor(static_cast<int>(alive.size()), round));
  for (size_t r = 0; r < alive.size(); ++r) {
    auto& out = g.neighbours[static_cast<size_t>(alive[r])];
    for (int j : sub.neighbours[r]) out.push_back(alive[static_cast<size_t>(j)]);
    std::sort(out.begin(), out.end());
  }
  return g;
}

}  // namespace tern
