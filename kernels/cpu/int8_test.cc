#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<float> RoundTrip(Codec& codec, const std::vector<float>& x, uint64_t seed,
                             EncodedTensor* enc) {
  EncodeOptions o;
  o.seed = seed;
  EXPECT_THAT(codec.Encode(x, o, enc), IsOk());
  std::vector<float> y(x.size());
  EXPECT_THAT(codec.Decode(EncodedView::Of(*enc), absl::MakeSpan(y)), IsOk());
  return y;
}

TEST(Int8Codec, NearestRoundingErrorIsAtMostHalfAStepPerBlock) {
  auto registry = NewBuiltinCodecRegistry();
  for (const char* spec : {"int8:block=64", "int8:block=64,mode=minmax"}) {
    auto codec = registry->Create(spec);
    ASSERT_THAT(codec, IsOk());
    const auto x = testing::Gaussian(1000, 31, 3.0f, 0.5f);
    EncodedTensor enc;
    const auto y = RoundTrip(**codec, x, 1, &enc);
    const bool minmax = std::string(spec).find("minmax") != std::string::npos;
    ASSERT_EQ(enc.scales.size(), (minmax ? 2u : 1u) * 16);
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t b = i / 64;
      const float step = minmax ? enc.scales[2 * b + 1] : enc.scales[b];
      ASSERT_LE(std::fabs(y[i] - x[i]), 0.5f * step * 1.0001f + 1e-6f) << spec << " at " << i;
    }
  }
}

TEST(Int8Codec, StochasticRoundingIsUnbiased) {
  auto codec = NewBuiltinCodecRegistry()->Create("int8:round=stochastic,block=16");
  ASSERT_THAT(codec, IsOk());
  const auto x = testing::Gaussian(64, 32);
  std::vector<double> mean(x.size(), 0.0);
  const int trials = 4000;
  float max_step = 0;
  for (int t = 0; t < trials; ++t) {
    EncodedTensor enc;
    const auto y = RoundTrip(**codec, x, 1000 + t, &enc);
    for (float s : enc.scales) max_step = std::max(max_step, s);
    for (size_t i = 0; i < x.size(); ++i) mean[i] += y[i] / trials;
  }
  // Each draw is within one step; the mean of 4000 is within ~5 standard errors (step/2/sqrt(n)).
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(mean[i], x[i], 5 * 0.5 * max_step / std::sqrt(double(trials))) << i;
  }
}

TEST(Int8Codec, RejectsMinus128BadModeAndBadBlock) {
  auto codec = NewBuiltinCodecRegistry()->Create("int8");
  ASSERT_THAT(codec, IsOk());
  const auto x = testing::Gaussian(100, 33);
  EncodedTensor enc;
  RoundTrip(**codec, x, 1, &enc);
  std::vector<float> y(x.size());
  EncodedTensor bad = enc;
  bad.payload[5 + 17] = static_cast<char>(0x80);
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("-128")));
  bad = enc;
  bad.payload[4] = 7;
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mode")));
  bad = enc;
  bad.payload[0] = bad.payload[1] = bad.payload[2] = bad.payload[3] = 0;
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block")));
  bad = enc;
  bad.scales[0] = -1.0f;
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scale")));
}

}  // namespace
}  // namespace tern
