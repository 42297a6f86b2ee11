#include <cmath>
#include <cstring>
#include <vector>

#include "common/half.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;

std::vector<uint16_t> Words(const EncodedTensor& enc) {
  std::vector<uint16_t> w(enc.payload.size() / 2);
  std::memcpy(w.data(), enc.payload.data(), enc.payload.size());
  return w;
}

// Every fp32 bit pattern class (normals, subnormals, overflow, ties): the vectorised / F16C path
// must produce exactly the scalar round-to-nearest-even reference.
TEST(Fp16Codec, PayloadMatchesScalarRoundToNearestEvenBitForBit) {
  auto codec = NewBuiltinCodecRegistry()->Create("fp16");
  ASSERT_THAT(codec, IsOk());
  const RngKey key = MakeRngKey(21);
  std::vector<float> x(1 << 18);
  for (uint32_t i = 0; i < x.size(); ++i) {
    uint32_t bits = Random32(key, i);
    if ((bits & 0x7f800000u) == 0x7f800000u) bits &= ~0x00400000u;  // keep Inf, avoid NaN
    if ((bits & 0x7fffffffu) > 0x7f800000u) bits = 0x7f800000u;
    std::memcpy(&x[i], &bits, 4);
    if (i % 3 == 0) x[i] = std::ldexp(x[i] - std::trunc(x[i]), static_cast<int>(i % 40) - 30);
  }
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  const auto w = Words(enc);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(w[i], FloatToHalf(x[i])) << x[i];
  std::vector<float> y(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      ASSERT_TRUE(std::isnan(y[i]));
    } else {
      ASSERT_EQ(y[i], HalfToFloat(w[i])) << x[i];
    }
  }
}

TEST(Bf16Codec, PayloadIsTheRoundedHighHalf) {
  auto codec = NewBuiltinCodecRegistry()->Create("bf16");
  ASSERT_THAT(codec, IsOk());
  const std::vector<float> x = {1.0f, -2.5f, 1.0f + 0x1p-8f, 3.14159f, 0.0f, -0.0f, 1e38f};
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  const auto w = Words(enc);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(w[i], FloatToBfloat16(x[i]));
  EXPECT_EQ(w[2], 0x3f80);  // tie to even
}

TEST(NoneCodec, IsBitExactIncludingSpecialValues) {
  auto codec = NewBuiltinCodecRegistry()->Create("none");
  ASSERT_THAT(codec, IsOk());
  const std::vector<float> x = {0.0f, -0.0f, 1e-45f, INFINITY, -INFINITY, 3.0f};
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  EXPECT_EQ(enc.payload.size(), 4 * x.size());
  std::vector<float> y(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  EXPECT_EQ(std::memcmp(x.data(), y.data(), 4 * x.size()), 0);
}

}  // namespace
}  // namespace tern
