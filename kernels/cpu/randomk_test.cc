#include "kernels/cpu/randomk.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/cpu/stochastic_test_util.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;

TEST(RandomK, PositionsArePermutationsOfTheRange) {
  for (uint64_t d : {1u, 2u, 3u, 17u, 1000u, 65537u}) {
    std::vector<uint32_t> pos(d);
    for (uint32_t j = 0; j < d; ++j) pos[j] = RandomKPosition(77, d, j);
    std::sort(pos.begin(), pos.end());
    for (uint32_t j = 0; j < d; ++j) ASSERT_EQ(pos[j], j) << "d = " << d;
  }
}

TEST(RandomK, DifferentSeedsPickDifferentPositionsUniformly) {
  const uint64_t d = 1000;
  std::vector<int> hits(d, 0);
  const int seeds = 2000, k = 50;
  for (int s = 0; s < seeds; ++s) {
    for (uint32_t j = 0; j < k; ++j) hits[RandomKPosition(s, d, j)]++;
  }
  const double expect = double(seeds) * k / d;  // 100 per position
  for (uint64_t i = 0; i < d; ++i) ASSERT_NEAR(hits[i], expect, 6 * std::sqrt(expect)) << i;
}

TEST(RandomK, UnbiasedVariantAveragesToTheInput) {
  auto codec = NewBuiltinCodecRegistry()->Create("randomk:ratio=0.25,unbiased=1");
  ASSERT_THAT(codec, IsOk());
  const auto x = testing::Gaussian(200, 51);
  const int trials = 4000;
  const auto m = testing::DecodeMoments(**codec, x, trials);
  testing::ExpectUnbiased(m, x, trials);
}

TEST(RandomK, DecoderRebuildsThePositionsFromTheSeedAlone) {
  auto registry = NewBuiltinCodecRegistry();
  auto codec = registry->Create("randomk:ratio=0.1");
  ASSERT_THAT(codec, IsOk());
  const auto x = testing::Gaussian(5000, 52);
  EncodedTensor enc;
  EncodeOptions o;
  o.seed = 1234567;
  ASSERT_THAT((*codec)->Encode(x, o, &enc), IsOk());
  EXPECT_EQ(enc.payload.size(), 12u + 4 * 500);
  std::vector<float> y(x.size());
  ASSERT_THAT(registry->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  for (uint32_t j = 0; j < 500; ++j) {
    const uint32_t p = RandomKPosition(1234567, x.size(), j);
    ASSERT_EQ(y[p], x[p]);
  }
  EXPECT_EQ(std::count_if(y.begin(), y.end(), [](float v) { return v != 0; }), 500);
}

}  // namespace
}  // namespace tern
