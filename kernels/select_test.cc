#include "kernels/select.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/topk.h"
#include "tests/testing/data.h"

namespace tern {
namespace {

TEST(SelectTopK, MatchesSortingOnAdversarialLayoutsAndTies) {
  std::vector<std::vector<float>> inputs;
  std::vector<float> ascending(50000);
  for (size_t i = 0; i < ascending.size(); ++i) ascending[i] = static_cast<float>(i);
  inputs.push_back(ascending);  // strided sample sees only small values
  std::vector<float> spikes(50000, 0.0f);
  for (size_t i = 0; i < spikes.size(); i += 997) spikes[i] = -5.0f;  // few large, many ties
  inputs.push_back(spikes);
  inputs.push_back(std::vector<float>(4096, 1.0f));  // all equal
  inputs.push_back(testing::Gaussian(70001, 42));
  for (const auto& x : inputs) {
    for (size_t k : {size_t{1}, size_t{17}, size_t{500}, x.size() - 1, x.size()}) {
      std::vector<uint32_t> idx;
      SelectTopK(x, k, &idx);
      ASSERT_EQ(idx.size(), k);
      ASSERT_TRUE(std::is_sorted(idx.begin(), idx.end()));
      ASSERT_EQ(std::adjacent_find(idx.begin(), idx.end()), idx.end());
      std::vector<float> sel, all;
      for (uint32_t i : idx) sel.push_back(std::fabs(x[i]));
      for (float v : x) all.push_back(std::fabs(v));
      std::sort(sel.begin(), sel.end(), std::greater<>());
      std::sort(all.begin(), all.end(), std::greater<>());
      all.resize(k);
      ASSERT_EQ(sel, all) << "k = " << k;  // the multiset of kept magnitudes is the top-k
    }
  }
}

TEST(SelectDgc, SelectionLandsInTheBandAroundK) {
  for (double ratio : {0.001, 0.01, 0.05}) {
    const auto x = testing::Gaussian(1 << 20, 43);
    const size_t k = SparseK(ratio, x.size());
    std::vector<uint32_t> idx;
    const DgcSelection sel = SelectDgc(x, k, 0.01, &idx);
    EXPECT_GE(idx.size(), (8 * k) / 10) << ratio;
    EXPECT_LE(idx.size(), (13 * k) / 10) << ratio;
    EXPECT_LE(sel.tries, 10);
    EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
    if (sel.selected == idx.size()) {  // not trimmed: everything at or above the threshold
      for (uint32_t i : idx) ASSERT_GE(MagnitudeKey(x[i]), sel.threshold_key);
    }
  }
}

TEST(SelectDgc, LowersTheThresholdWhenTheSampleOverestimates) {
  // Large values only at positions the strided sample never sees: the first estimate selects too
  // few, so the threshold must drop (x0.8 per try) to reach 0.8k.
  std::vector<float> x(1 << 16, 0.01f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * (1 + (i % 64 == 0 ? 50.0f : float(i % 7)));
  std::vector<uint32_t> idx;
  const size_t k = 2000;
  const DgcSelection sel = SelectDgc(x, k, 0.01, &idx);
  EXPECT_GE(sel.tries, 1);
  EXPECT_LE(sel.tries, 10);
  EXPECT_TRUE(idx.size() >= 8 * k / 10 || sel.tries == 10);
  EXPECT_LE(idx.size(), 13 * k / 10);
}

}  // namespace
}  // namespace tern
