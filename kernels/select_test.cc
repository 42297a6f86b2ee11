#include "kernels/select.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/topk.h"
#include "kernels/format/sparse.h"
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
      std::vector<float> values;
      SelectTopK(x, k, &idx, nullptr, &values);
      ASSERT_EQ(idx.size(), k);
      ASSERT_EQ(values.size(), k);
      for (size_t j = 0; j < k; ++j) ASSERT_EQ(values[j], x[idx[j]]);
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

// The filtering pass (AVX-512 compress, or the scalar loop under TERN_SIMD=avx2/none) keeps
// exactly what a plain loop keeps, with bit-identical values, over sizes with ragged tails and
// the awkward floats.
TEST(SelectAtLeast, MatchesAPlainFilterIncludingValuesAndOddFloats) {
  for (size_t n : {size_t{5}, size_t{2048}, size_t{3 * 2048 + 5}, size_t{100003}}) {
    std::vector<float> x = testing::Gaussian(n, 44);
    x[0] = std::numeric_limits<float>::quiet_NaN();
    if (n > 3) {
      x[1] = -std::numeric_limits<float>::infinity();
      x[2] = -0.0f;
      x[3] = std::numeric_limits<float>::denorm_min();
    }
    for (float t : {0.0f, 1e-30f, 0.5f, 2.5f, std::numeric_limits<float>::infinity()}) {
      std::vector<uint32_t> idx;
      std::vector<float> values;
      SelectAtLeast(x, MagnitudeKey(t), &idx, nullptr, &values);
      std::vector<uint32_t> want;
      for (size_t i = 0; i < n; ++i) {
        if (MagnitudeKey(x[i]) >= MagnitudeKey(t)) want.push_back(static_cast<uint32_t>(i));
      }
      ASSERT_EQ(idx, want) << "n = " << n << ", t = " << t;
      ASSERT_EQ(values.size(), idx.size());
      for (size_t j = 0; j < idx.size(); ++j) {
        ASSERT_EQ(std::bit_cast<uint32_t>(values[j]), std::bit_cast<uint32_t>(x[idx[j]]));
      }
    }
  }
}

// Blocks where none, few and many pass, in turn (each block's loop is chosen by how many of the
// one before passed), with several passing within 64 values, at offsets that leave
// ragged tails: every entry is the plain filter's, in order.
TEST(SelectAtLeast, MixedDensitiesAndClustersMatchAPlainFilter) {
  std::vector<float> x = testing::Gaussian(11 * 2048 + 77, 46);
  for (size_t i = 2048; i < 2 * 2048; ++i) x[i] *= 8.0f;                 // a dense block
  for (size_t i = 3 * 2048; i < 5 * 2048; ++i) x[i] *= 0.1f;             // blocks where none pass
  for (size_t i = 5 * 2048 + 100; i < 5 * 2048 + 164; ++i) x[i] = 9.0f;  // 64 in a row pass
  for (size_t i = 7 * 2048; i < 7 * 2048 + 2048; i += 61) x[i] = -7.0f;  // 1 in 61
  for (size_t i = 9 * 2048 + 3; i < 9 * 2048 + 40; i += 4) x[i] = 6.0f;  // 3+ in one 64
  const uint32_t key = MagnitudeKey(2.5f);
  for (size_t from : {size_t{0}, size_t{1}, size_t{63}, size_t{2047}}) {
    const absl::Span<const float> part = absl::MakeConstSpan(x).subspan(from);
    std::vector<uint32_t> idx;
    std::vector<float> values;
    AppendAtLeast(part, 1000, key, &idx, &values);
    std::vector<uint32_t> want;
    for (size_t i = 0; i < part.size(); ++i) {
      if (MagnitudeKey(part[i]) >= key) want.push_back(1000 + static_cast<uint32_t>(i));
    }
    ASSERT_EQ(idx, want) << "from " << from;
    for (size_t j = 0; j < idx.size(); ++j) {
      ASSERT_EQ(std::bit_cast<uint32_t>(values[j]), std::bit_cast<uint32_t>(part[idx[j] - 1000]));
    }
  }
}

// A caller's own pass (blocks appended one by one with their offsets) finds what SelectAtLeast
// finds, and KeepTopK over any superset of the top-k that a threshold gives is SelectTopK's
// answer, ties included.
TEST(KeepTopK, FromBlocksFilteredByAnyLowEnoughThresholdIsSelectTopK) {
  std::vector<float> ties(30011, 0.5f);
  for (size_t i = 0; i < ties.size(); i += 3) ties[i] = -2.0f;
  for (const std::vector<float>& x : {testing::Gaussian(30011, 45), ties}) {
    for (size_t k : {size_t{1}, size_t{300}, size_t{10000}}) {
      std::vector<uint32_t> want;
      std::vector<float> want_values;
      SelectTopK(x, k, &want, nullptr, &want_values);
      float kth = std::numeric_limits<float>::infinity();
      for (float v : want_values) kth = std::min(kth, std::fabs(v));
      for (float margin : {1.0f, 0.9f, 0.5f, 0.0f}) {
        const uint32_t min_key = MagnitudeKey(kth * margin);
        std::vector<uint32_t> idx, all;
        std::vector<float> values, all_values;
        for (size_t b = 0; b < x.size(); b += 1000) {
          const size_t len = std::min<size_t>(1000, x.size() - b);
          AppendAtLeast(absl::MakeConstSpan(x).subspan(b, len), static_cast<uint32_t>(b), min_key,
                        &idx, &values);
        }
        SelectAtLeast(x, min_key, &all, nullptr, &all_values);
        ASSERT_EQ(idx, all);
        ASSERT_EQ(values, all_values);
        KeepTopK(k, &idx, &values);
        EXPECT_EQ(idx, want) << "k = " << k << ", margin " << margin;
        EXPECT_EQ(values, want_values);
      }
    }
  }
}

TEST(SelectDgc, SelectionLandsInTheBandAroundK) {
  for (double ratio : {0.001, 0.01, 0.05}) {
    const auto x = testing::Gaussian(1 << 20, 43);
    const size_t k = format::SparseK(ratio, x.size());
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
