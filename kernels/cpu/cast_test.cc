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
using ::tern::testing::StatusIs;

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
  // Decoding refuses the payload while it holds an Inf (harmful values never reach a model);
  // without them, every word decodes to its exact value.
  std::vector<float> y(x.size());
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  for (size_t i = 0; i < x.size(); ++i) {
    if ((w[i] & 0x7c00u) == 0x7c00u) x[i] = 0.0f;
  }
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  const auto finite = Words(enc);
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], HalfToFloat(finite[i])) << x[i];
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

TEST(NoneCodec, IsBitExactForFiniteValuesAndRefusesInfAndNaNLeavingTheOutputAlone) {
  auto codec = NewBuiltinCodecRegistry()->Create("none");
  ASSERT_THAT(codec, IsOk());
  const std::vector<float> x = {0.0f, -0.0f, 1e-45f, 3.4e38f, -3.4e38f, 3.0f};
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  EXPECT_EQ(enc.payload.size(), 4 * x.size());
  std::vector<float> y(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  EXPECT_EQ(std::memcmp(x.data(), y.data(), 4 * x.size()), 0);
  for (float bad : {INFINITY, -INFINITY, std::nanf("")}) {
    std::vector<float> z = x;
    z[4] = bad;
    ASSERT_THAT((*codec)->Encode(z, {}, &enc), IsOk());
    std::vector<float> out(x.size(), 7.0f);
    EXPECT_THAT((*codec)->DecodeAccumulate(EncodedView::Of(enc), 1.0f, absl::MakeSpan(out)),
                StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_EQ(out, std::vector<float>(x.size(), 7.0f));
  }
}

// A view marked checked (its message passed the codec's checks on arrival) decodes to the same
// bits without reading the payload for Inf and NaN again; its size is still checked.
TEST(CastCodecs, ACheckedViewDecodesAlikeWithoutTheValueCheckAndItsSizeIsStillChecked) {
  for (const char* spec : {"none", "fp16", "bf16"}) {
    SCOPED_TRACE(spec);
    auto codec = NewBuiltinCodecRegistry()->Create(spec);
    ASSERT_THAT(codec, IsOk());
    std::vector<float> x(5000);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * static_cast<float>(i));
    EncodedTensor enc;
    ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
    EncodedView checked = EncodedView::Of(enc);
    checked.checked = true;
    std::vector<float> want(x.size(), 1.0f), got(x.size(), 1.0f);
    ASSERT_THAT((*codec)->DecodeAccumulate(EncodedView::Of(enc), 0.5f, absl::MakeSpan(want)),
                IsOk());
    ASSERT_THAT((*codec)->DecodeAccumulate(checked, 0.5f, absl::MakeSpan(got)), IsOk());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), 4 * x.size()), 0);
    // The value check is what it skips: an Inf the caller vouched against goes through.
    x[7] = INFINITY;
    ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
    checked = EncodedView::Of(enc);
    checked.checked = true;
    EXPECT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(got)),
                StatusIs(absl::StatusCode::kInvalidArgument));
    ASSERT_THAT((*codec)->Decode(checked, absl::MakeSpan(got)), IsOk());
    EXPECT_TRUE(std::isinf(got[7]));
    // Sizes are checked whatever the view says.
    enc.payload.resize(enc.payload.size() - 2);
    checked = EncodedView::Of(enc);
    checked.checked = true;
    EXPECT_THAT((*codec)->Decode(checked, absl::MakeSpan(got)),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

}  // namespace
}  // namespace tern
