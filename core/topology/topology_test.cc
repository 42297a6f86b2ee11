#include "core/topology/topology.h"

#include <cmath>
#include <queue>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

std::vector<std::vector<double>> Dense(const std::vector<MixingRow>& rows) {
  const size_t n = rows.size();
  std::vector<std::vector<double>> w(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i) {
    w[i][i] = rows[i].self;
    for (const auto& [j, v] : rows[i].neighbours) w[i][j] = v;
  }
  return w;
}

bool Connected(const Graph& g) {
  std::vector<bool> seen(g.size(), false);
  std::queue<int> q;
  q.push(0);
  seen[0] = true;
  int count = 1;
  while (!q.empty()) {
    const int i = q.front();
    q.pop();
    for (int j : g.neighbours[i]) {
      if (!seen[j]) {
        seen[j] = true;
        ++count;
        q.push(j);
      }
    }
  }
  return count == g.size();
}

class EveryTopology : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryTopology, MixingMatrixIsSymmetricNonNegativeAndDoublyStochastic) {
  auto topology = NewBuiltinTopologyRegistry()->Create(GetParam());
  ASSERT_THAT(topology, IsOk());
  for (int n = 1; n <= 17; ++n) {
    for (int64_t round = 0; round < 6; ++round) {
      auto g = (*topology)->GraphFor(n, round);
      ASSERT_THAT(g, IsOk());
      ASSERT_EQ(g->size(), n);
      for (int i = 0; i < n; ++i) {
        for (int j : g->neighbours[i]) {
          ASSERT_NE(i, j);
          ASSERT_TRUE(std::binary_search(g->neighbours[j].begin(), g->neighbours[j].end(), i))
              << GetParam() << " n=" << n << " edge " << i << "-" << j << " is one-way";
        }
      }
      for (WeightRule rule : {WeightRule::kAuto, WeightRule::kMetropolis}) {
        auto rows = MixingWeights(*g, rule);
        ASSERT_THAT(rows, IsOk());
        const auto w = Dense(*rows);
        for (int i = 0; i < n; ++i) {
          double row = 0, col = 0;
          for (int j = 0; j < n; ++j) {
            ASSERT_GE(w[i][j], 0.0);
            ASSERT_NEAR(w[i][j], w[j][i], 1e-15);
            row += w[i][j];
            col += w[j][i];
          }
          ASSERT_NEAR(row, 1.0, 1e-12) << GetParam() << " n=" << n << " row " << i;
          ASSERT_NEAR(col, 1.0, 1e-12) << GetParam() << " n=" << n << " column " << i;
        }
      }
      if ((*topology)->IsStatic() && n > 1) {
        EXPECT_TRUE(Connected(*g)) << GetParam() << " n=" << n;
      }
    }
  }
}

// Every registered topology by the registry's own list, plus one with parameters.
std::vector<std::string> TopologySpecs() {
  std::vector<std::string> specs = NewBuiltinTopologyRegistry()->Names();
  specs.push_back("random-matching:seed=9");
  return specs;
}

INSTANTIATE_TEST_SUITE_P(Builtin, EveryTopology, ::testing::ValuesIn(TopologySpecs()),
                         [](const auto& p) {
                           std::string s = p.param;
                           for (char& c : s) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return s;
                         });

TEST(Topology, DegreesMatchTheirDefinitions) {
  auto reg = NewBuiltinTopologyRegistry();
  auto degree = [&](const char* spec, int n, int64_t round, int i) {
    auto t = reg->Create(spec);
    EXPECT_THAT(t, IsOk());
    return static_cast<int>((*t)->GraphFor(n, round)->neighbours[i].size());
  };
  EXPECT_EQ(degree("ring", 8, 0, 3), 2);
  EXPECT_EQ(degree("torus", 16, 0, 5), 4);        // 4 x 4
  EXPECT_EQ(degree("exponential", 16, 0, 0), 7);  // +-1, +-2, +-4, 8
  EXPECT_EQ(degree("complete", 8, 0, 0), 7);
  EXPECT_EQ(degree("one-peer-exponential", 8, 2, 0), 1);  // hop 4 = n/2: one peer
  EXPECT_EQ(degree("one-peer-exponential", 8, 0, 0), 2);  // hop 1: i-1 and i+1
  EXPECT_EQ(degree("random-matching", 8, 3, 6), 1);
}

TEST(Topology, TimeVaryingGraphsAreConnectedOverAPeriod) {
  auto reg = NewBuiltinTopologyRegistry();
  for (const char* spec : {"one-peer-exponential", "random-matching"}) {
    auto t = reg->Create(spec);
    ASSERT_THAT(t, IsOk());
    for (int n : {2, 5, 8, 13}) {
      std::vector<std::vector<int>> nb(n);
      for (int64_t round = 0; round < 32; ++round) {
        const Graph g = *(*t)->GraphFor(n, round);
        for (int i = 0; i < n; ++i) {
          nb[i].insert(nb[i].end(), g.neighbours[i].begin(), g.neighbours[i].end());
        }
      }
      EXPECT_TRUE(Connected(Graph{nb})) << spec << " n=" << n;
    }
  }
}

TEST(Topology, RandomMatchingIsTheSameOnEveryWorkerAndChangesPerRound) {
  auto a = NewBuiltinTopologyRegistry()->Create("random-matching:seed=4");
  auto b = NewBuiltinTopologyRegistry()->Create("random-matching:seed=4");
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ((*a)->GraphFor(10, 7)->neighbours, (*b)->GraphFor(10, 7)->neighbours);
  EXPECT_NE((*a)->GraphFor(10, 7)->neighbours, (*a)->GraphFor(10, 8)->neighbours);
}

TEST(Topology, UniformWeightsOnAnIrregularGraphAreRefused) {
  Graph star{{{1, 2}, {0}, {0}}};
  EXPECT_THAT(MixingWeights(star, WeightRule::kUniform),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto rows = MixingWeights(star, WeightRule::kAuto);  // falls back to Metropolis-Hastings
  ASSERT_THAT(rows, IsOk());
  EXPECT_DOUBLE_EQ((*rows)[0].neighbours[0].second, 1.0 / 3);
  EXPECT_DOUBLE_EQ((*rows)[1].self, 2.0 / 3);
}

TEST(Topology, DroppingANeighbourMovesItsWeightToSelf) {
  auto ring = NewBuiltinTopologyRegistry()->Create("ring");
  ASSERT_THAT(ring, IsOk());
  const auto rows = *MixingWeights(*(*ring)->GraphFor(5, 0), WeightRule::kAuto);
  const MixingRow r = DropNeighbours(rows[0], {1});
  ASSERT_EQ(r.neighbours.size(), 1u);
  EXPECT_EQ(r.neighbours[0].first, 4);
  EXPECT_NEAR(r.self, 2.0 / 3, 1e-15);
  EXPECT_NEAR(r.self + r.neighbours[0].second, 1.0, 1e-15);
}

TEST(Topology, BadSpecsAreRejectedWithTheKnownNames) {
  auto reg = NewBuiltinTopologyRegistry();
  EXPECT_THAT(reg->Create("hypercube"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reg->Create("ring:seed=3"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reg->Create("random-matching:seed=-1"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseWeightRule("max-degree"), StatusIs(absl::StatusCode::kInvalidArgument));
  auto ring = reg->Create("ring");
  ASSERT_THAT(ring, IsOk());
  EXPECT_THAT((*ring)->GraphFor(0, 0), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
