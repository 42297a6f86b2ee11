#include "core/workload/partition.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

std::vector<uint8_t> Labels(size_t n) {
  std::vector<uint8_t> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = static_cast<uint8_t>((i * 7) % 10);
  return y;
}

// Mean over workers of the largest class share: 0.1 for perfectly balanced, 1 for one class each.
double MeanTopClassShare(const std::vector<std::vector<uint32_t>>& parts,
                         const std::vector<uint8_t>& y) {
  double total = 0;
  for (const auto& p : parts) {
    std::vector<int> count(10, 0);
    for (uint32_t i : p) ++count[y[i]];
    total += p.empty() ? 1.0 : *std::max_element(count.begin(), count.end()) / double(p.size());
  }
  return total / parts.size();
}

TEST(Partition, IidAndDirichletHandOutEveryExampleExactlyOnce) {
  const auto y = Labels(10000);
  for (const char* spec : {"iid", "dirichlet:alpha=0.1", "dirichlet:alpha=100"}) {
    auto s = ParsePartition(spec);
    ASSERT_THAT(s, IsOk());
    auto parts = Partition(y, 10, 8, *s, 3);
    ASSERT_THAT(parts, IsOk());
    std::vector<int> seen(y.size(), 0);
    for (const auto& p : *parts) {
      for (uint32_t i : p) ++seen[i];
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; })) << spec;
  }
}

TEST(Partition, IidIsBalancedAndDirichletSkewGrowsAsAlphaShrinks) {
  const auto y = Labels(20000);
  auto share = [&](const char* spec) {
    auto parts = Partition(y, 10, 10, *ParsePartition(spec), 5);
    EXPECT_THAT(parts, IsOk());
    return MeanTopClassShare(*parts, y);
  };
  const double iid = share("iid"), wide = share("dirichlet:alpha=100"),
               mid = share("dirichlet:alpha=0.5"), narrow = share("dirichlet:alpha=0.05");
  EXPECT_LT(iid, 0.12);
  EXPECT_LT(wide, 0.15);
  EXPECT_GT(mid, wide + 0.1);
  EXPECT_GT(narrow, mid);
  EXPECT_GT(narrow, 0.6);
}

TEST(Partition, ClassesGivesEachWorkerAtMostKClasses) {
  const auto y = Labels(10000);
  auto parts = Partition(y, 10, 8, *ParsePartition("classes:k=2"), 1);
  ASSERT_THAT(parts, IsOk());
  for (const auto& p : *parts) {
    std::set<int> classes;
    for (uint32_t i : p) classes.insert(y[i]);
    EXPECT_EQ(classes.size(), 2u);
    EXPECT_GT(p.size(), 300u);
  }
}

TEST(Partition, IsReproducibleFromTheSeed) {
  const auto y = Labels(1000);
  const auto s = *ParsePartition("dirichlet:alpha=0.3");
  EXPECT_EQ(*Partition(y, 10, 4, s, 9), *Partition(y, 10, 4, s, 9));
  EXPECT_NE(*Partition(y, 10, 4, s, 9), *Partition(y, 10, 4, s, 10));
}

TEST(Partition, BadSpecsAndArgumentsAreRejected) {
  EXPECT_THAT(ParsePartition("shards"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParsePartition("dirichlet:alpha=0"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParsePartition("iid:k=2"), StatusIs(absl::StatusCode::kInvalidArgument));
  const std::vector<uint8_t> y = {0, 1, 12};
  EXPECT_THAT(Partition(y, 10, 2, PartitionSpec{}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Partition({0, 1}, 10, 0, PartitionSpec{}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
