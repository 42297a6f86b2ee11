#include <bit>
#include <cmath>
#include <cstdint>
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

TEST(SignCodec, DecodesToTheChunkMeanMagnitudeWithTheInputSign) {
  auto codec = NewBuiltinCodecRegistry()->Create("sign:chunk=64");
  ASSERT_THAT(codec, IsOk());
  const auto x = testing::Gaussian(1000, 81);
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  ASSERT_EQ(enc.scales.size(), 16u);
  EXPECT_EQ(enc.payload.size(), 4u + 125);  // 1 bit per value
  std::vector<float> y(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  for (size_t c = 0; c < 16; ++c) {
    double l1 = 0;
    const size_t begin = c * 64, end = std::min<size_t>(x.size(), begin + 64);
    for (size_t i = begin; i < end; ++i) l1 += std::fabs(x[i]);
    EXPECT_NEAR(enc.scales[c], l1 / (end - begin), 1e-5);
    for (size_t i = begin; i < end; ++i) {
      ASSERT_EQ(y[i], std::signbit(x[i]) ? -enc.scales[c] : enc.scales[c]);
    }
  }
}

TEST(SignCodec, AccumulatingAddsTheSameBitsAsDecodingThenAddingTheWeightedValues) {
  auto codec = NewBuiltinCodecRegistry()->Create("sign:chunk=64");
  ASSERT_THAT(codec, IsOk());
  auto x = testing::Gaussian(1003, 83);            // an odd tail: the last chunk ends mid-byte
  for (size_t i = 128; i < 192; ++i) x[i] = 0.0f;  // a chunk of scale 0: signed zeros
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  std::vector<float> decoded(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(decoded)), IsOk());
  for (const float w : {0.25f, -1.0f / 3.0f, 1.0f}) {
    std::vector<float> out = testing::Gaussian(x.size(), 84);
    out[130] = -0.0f;
    std::vector<float> expected = out;
    for (size_t i = 0; i < x.size(); ++i) {
      volatile float product = w * decoded[i];  // rounded alone: no fused multiply-add
      expected[i] += product;
    }
    ASSERT_THAT((*codec)->DecodeAccumulate(EncodedView::Of(enc), w, absl::MakeSpan(out)), IsOk());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(expected[i]))
          << "value " << i << ", weight " << w;
    }
  }
}

TEST(SignCodec, RejectsBadChunkAndPadding) {
  auto codec = NewBuiltinCodecRegistry()->Create("sign");
  ASSERT_THAT(codec, IsOk());
  EXPECT_THAT(NewBuiltinCodecRegistry()->Create("sign:chunk=12"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  const auto x = testing::Gaussian(13, 82);
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  std::vector<float> y(x.size());
  EncodedTensor bad = enc;
  bad.payload.back() = static_cast<char>(0xff);  // bits 13..15 are padding
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  bad = enc;
  bad.payload[0] = 12;
  bad.payload[1] = bad.payload[2] = bad.payload[3] = 0;
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
