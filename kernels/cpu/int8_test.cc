#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/rng.h"
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

// Every code against docs/wire-format.md's formula (u = 0.5, or Uniform(Key(seed), i) for
// stochastic rounding), computed here in scalar float arithmetic (product rounded, then + u):
// the SIMD paths must agree bit for bit.
TEST(Int8Codec, CodesFollowTheDocumentedFormulaAndDraws) {
  auto registry = NewBuiltinCodecRegistry();
  for (const char* spec : {"int8:round=stochastic,block=100", "int8:round=stochastic,block=256",
                           "int8:round=stochastic,block=100,mode=minmax", "int8:block=100",
                           "int8:block=100,mode=minmax"}) {
    auto codec = registry->Create(spec);
    ASSERT_THAT(codec, IsOk());
    const bool minmax = std::string(spec).find("minmax") != std::string::npos;
    const bool stochastic = std::string(spec).find("stochastic") != std::string::npos;
    auto x = testing::Gaussian(1000 + 37, 93, 2.0f);
    x[3] = 0.0f;
    x[4] = -0.0f;
    x[5] = std::numeric_limits<float>::denorm_min();
    EncodedTensor e;
    EncodeOptions o;
    o.seed = 17;
    ASSERT_THAT((*codec)->Encode(x, o, &e), IsOk()) << spec;
    const size_t block = std::string(spec).find("block=100") != std::string::npos ? 100 : 256;
    const RngKey key = MakeRngKey(o.seed);
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t b = i / block;
      const float u = stochastic ? Uniform01Lo(key, static_cast<uint32_t>(i)) : 0.5f;
      volatile float product;  // rounded to float, as the format specifies
      int expect;
      if (minmax) {
        const float lo = e.scales[2 * b];
        const size_t end = std::min(x.size(), (b + 1) * block);
        const float hi = *std::max_element(x.begin() + b * block, x.begin() + end);
        product = (x[i] - lo) * (hi > lo ? 255.0f / (hi - lo) : 0.0f);
        expect = static_cast<int>(std::clamp(std::floor(product + u), 0.0f, 255.0f));
        ASSERT_EQ(static_cast<uint8_t>(e.payload[5 + i]), expect) << spec << " element " << i;
      } else {
        float m = 0;
        for (size_t j = b * block; j < std::min(x.size(), (b + 1) * block); ++j) {
          m = std::max(m, std::fabs(x[j]));
        }
        const float scale_inv = m > 0 ? 127.0f / m : 0.0f;
        product = x[i] * scale_inv;
        expect = static_cast<int>(std::clamp(std::floor(product + u), -127.0f, 127.0f));
        ASSERT_EQ(static_cast<int8_t>(e.payload[5 + i]), expect) << spec << " element " << i;
      }
    }
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
