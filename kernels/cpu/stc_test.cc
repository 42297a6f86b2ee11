#include "kernels/cpu/stc.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/cpu/topk.h"
#include "kernels/format/sparse.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

TEST(Stc, GolombParameterFollowsTheBStarRule) {
  // b* = 1 + floor(log2(ln(phi - 1) / ln(1 - p))).
  EXPECT_EQ(StcGolombBits(1, 100), 6);   // p = 0.01: ln(0.618)/ln(0.99) = 47.9
  EXPECT_EQ(StcGolombBits(1, 1000), 9);  // p = 0.001: 481
  EXPECT_EQ(StcGolombBits(1, 10), 3);    // p = 0.1: 4.57
  EXPECT_EQ(StcGolombBits(4, 4), 0);
  EXPECT_EQ(StcGolombBits(0, 4), 0);
}

TEST(Stc, KeepsTopKPositionsWithSignTimesMeanMagnitude) {
  auto codec = NewBuiltinCodecRegistry()->Create("stc:ratio=0.02");
  ASSERT_THAT(codec, IsOk());
  const auto x = testing::Gaussian(50000, 101);
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  std::vector<float> y(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  auto topk = NewBuiltinCodecRegistry()->Create("topk:ratio=0.02");
  EncodedTensor t;
  ASSERT_THAT((*topk)->Encode(x, {}, &t), IsOk());
  std::vector<float> yt(x.size());
  ASSERT_THAT((*topk)->Decode(EncodedView::Of(t), absl::MakeSpan(yt)), IsOk());
  double sum = 0;
  size_t k = 0;
  for (float v : yt) {
    if (v != 0) sum += std::fabs(v), ++k;
  }
  const float mu = static_cast<float>(sum / k);
  EXPECT_NEAR(enc.scales[0], mu, 1e-5f * mu);
  for (size_t i = 0; i < x.size(); ++i) {
    if (yt[i] == 0) {
      ASSERT_EQ(y[i], 0.0f);
    } else {
      ASSERT_EQ(y[i], std::signbit(x[i]) ? -enc.scales[0] : enc.scales[0]);
    }
  }
}

// Measured position bits per non-zero against b* + 1 / (1 - (1 - p)^(2^b*)) for uniformly spread
// positions (the top-k of i.i.d. data), plus one sign bit each.
TEST(Stc, MeasuredBitsMatchTheGolombFormula) {
  for (double ratio : {0.001, 0.01, 0.05}) {
    const auto x = testing::Gaussian(1 << 20, 102);
    auto codec = NewBuiltinCodecRegistry()->Create(absl::StrCat("stc:ratio=", ratio));
    ASSERT_THAT(codec, IsOk());
    EncodedTensor enc;
    ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
    const size_t k = format::SparseK(ratio, x.size());
    const double p = double(k) / x.size();
    const int b = StcGolombBits(k, x.size());
    const double expected = b + 1.0 / (1.0 - std::pow(1.0 - p, std::ldexp(1.0, b)));
    const double measured = (8.0 * (enc.payload.size() - 5)) / k - 1.0;  // minus the sign bit
    EXPECT_NEAR(measured, expected, 0.03 * expected) << "ratio " << ratio;
    RecordProperty(absl::StrCat("position_bits_", ratio), absl::StrCat(measured, " vs ", expected));
  }
}

TEST(Stc, RejectsBadGolombParameterAndOutOfRangePositions) {
  auto codec = NewBuiltinCodecRegistry()->Create("stc:ratio=0.5");
  ASSERT_THAT(codec, IsOk());
  const std::vector<float> x = {1, -2, 3, -4, 5, -6, 7, -8};
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  std::vector<float> y(x.size());
  EncodedTensor bad = enc;
  bad.payload[4] = 40;
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  bad = enc;
  const uint32_t k = 8;  // all 8 positions claimed, but the stream holds 4
  std::memcpy(bad.payload.data(), &k, 4);
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
