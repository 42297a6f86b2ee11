#include <bit>
#include <cmath>
#include <cstdint>
#include <utility>
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

// Payloads of two chunk sizes, and a sign payload beside an int8 one, summed through the
// registry: each added in turn, bit for bit, as when every payload has the same chunk.
TEST(SignCodec, SummingPayloadsOfOtherChunksOrCodecsAddsEachInTurn) {
  const auto registry = NewBuiltinCodecRegistry();
  const size_t n = 17000;
  std::vector<EncodedTensor> encoded;
  int seed = 90;
  for (const char* spec : {"sign:chunk=64", "sign:chunk=4096", "int8", "sign:chunk=64"}) {
    auto codec = registry->Create(spec);
    ASSERT_THAT(codec, IsOk());
    encoded.emplace_back();
    ASSERT_THAT((*codec)->Encode(testing::Gaussian(n, seed++), {}, &encoded.back()), IsOk());
  }
  std::vector<EncodedView> views;
  for (const EncodedTensor& e : encoded) views.push_back(EncodedView::Of(e));
  const float weights[4] = {0.25f, 0.25f, -0.5f, 1.0f / 3.0f};
  for (const auto& [first, count] : {std::pair<size_t, size_t>{0, 2}, {0, 4}, {1, 3}}) {
    const auto some = absl::MakeConstSpan(views).subspan(first, count);
    const auto their_weights = absl::MakeConstSpan(weights).subspan(first, count);
    std::vector<float> many = testing::Gaussian(n, 99), in_turn = many;
    for (size_t j = 0; j < count; ++j) {
      ASSERT_THAT(registry->DecodeAccumulate(some[j], their_weights[j], absl::MakeSpan(in_turn)),
                  IsOk());
    }
    ASSERT_THAT(registry->DecodeAccumulateMany(some, their_weights, absl::MakeSpan(many)), IsOk());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(many[i]), std::bit_cast<uint32_t>(in_turn[i]))
          << "value " << i << ", payloads " << first << " to " << first + count - 1;
    }
  }
}

// The norm a receiver's guard asks of every message, from the scales alone: the decoded values'.
TEST(SignCodec, TheNormFromTheScalesIsTheDecodedTensorsNorm) {
  auto codec = NewBuiltinCodecRegistry()->Create("sign:chunk=64");
  ASSERT_THAT(codec, IsOk());
  const auto x = testing::Gaussian(1003, 85);  // the last chunk short
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  std::vector<float> decoded(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(decoded)), IsOk());
  double sum = 0;
  for (float v : decoded) sum += static_cast<double>(v) * v;
  absl::StatusOr<double> norm = (*codec)->Norm(EncodedView::Of(enc));
  ASSERT_THAT(norm, IsOk());
  EXPECT_NEAR(*norm, std::sqrt(sum), 1e-12 * std::sqrt(sum));
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
