#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/cpu/stochastic_test_util.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

TEST(Qsgd, IsUnbiased) {
  auto codec = NewBuiltinCodecRegistry()->Create("qsgd:levels=4");
  ASSERT_THAT(codec, IsOk());
  const auto x = testing::Gaussian(256, 71);
  const int trials = 4000;
  testing::ExpectUnbiased(testing::DecodeMoments(**codec, x, trials), x, trials);
}

// Every level is the documented draw l = floor(r) + [U(seed, i) < r - floor(r)], r = |x| s / ‖x‖,
// whichever SIMD path made it (ctest reruns this under TERN_SIMD=avx2 and none). The size has a
// whole block, a partial block and a tail that is not a multiple of 16.
TEST(Qsgd, LevelsFollowTheDocumentedDraws) {
  const uint32_t s = 8;
  auto codec = NewBuiltinCodecRegistry()->Create(absl::StrCat("qsgd:levels=", s));
  ASSERT_THAT(codec, IsOk());
  auto x = testing::Gaussian(4096 + 1000 + 7, 73);
  x[5] = 0.0f;
  x[100] = -x[100];
  EncodedTensor enc;
  EncodeOptions eo;
  eo.seed = 1234;
  ASSERT_THAT((*codec)->Encode(x, eo, &enc), IsOk());
  std::vector<float> y(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  const float norm = enc.scales[0];
  const RngKey key = MakeRngKey(1234);
  const float scale = static_cast<float>(s) / norm;
  for (size_t i = 0; i < x.size(); ++i) {
    const float r = std::fabs(x[i]) * scale;
    const float f = std::floor(r);
    const float l = std::min(f + (Uniform01Lo(key, static_cast<uint32_t>(i)) < r - f ? 1.0f : 0.0f),
                             static_cast<float>(s));
    const double got = std::round(std::fabs(static_cast<double>(y[i])) * s / norm);
    ASSERT_EQ(got, l) << "element " << i;
    if (l > 0) {
      ASSERT_EQ(std::signbit(y[i]), std::signbit(x[i])) << "element " << i;
    }
  }
}

TEST(Qsgd, VarianceIsWithinThePapersBound) {
  const auto x = testing::Gaussian(4096, 72);
  double norm2 = 0;
  for (float v : x) norm2 += double(v) * v;
  const double d = x.size();
  for (int s : {1, 4, 16, 64}) {
    auto codec = NewBuiltinCodecRegistry()->Create(absl::StrCat("qsgd:levels=", s));
    ASSERT_THAT(codec, IsOk());
    const auto m = testing::DecodeMoments(**codec, x, 200);
    const double bound = std::min(d / (s * s), std::sqrt(d) / s) * norm2;
    EXPECT_LE(m.mean_sq_error, bound) << "s = " << s;
  }
}

TEST(Qsgd, BitsWithSqrtDLevelsStayUnderTheEliasBound) {
  for (size_t d : {1024u, 16384u, 65536u}) {
    const auto x = testing::Gaussian(d, 73);
    const int s = static_cast<int>(std::sqrt(double(d)));
    auto codec = NewBuiltinCodecRegistry()->Create(absl::StrCat("qsgd:levels=", s));
    ASSERT_THAT(codec, IsOk());
    const auto m = testing::DecodeMoments(**codec, x, 20);
    // The paper: at most 2.8 d + 32 bits (our 8-byte header is the extra 64).
    EXPECT_LE(m.mean_bits, 2.8 * d + 32 + 64) << "d = " << d;
    RecordProperty(absl::StrCat("bits_per_coord_d", d), absl::StrCat(m.mean_bits / d));
  }
}

TEST(Qsgd, RejectsLevelsAboveSAndBadHeader) {
  auto codec = NewBuiltinCodecRegistry()->Create("qsgd:levels=2");
  ASSERT_THAT(codec, IsOk());
  const std::vector<float> x = {3.0f, 0, 0, 0};  // one non-zero at level 2
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  std::vector<float> y(x.size());
  EncodedTensor bad = enc;
  bad.payload[0] = 1;  // claim s = 1: level 2 > s
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("level")));
  bad = enc;
  bad.payload[0] = bad.payload[1] = bad.payload[2] = bad.payload[3] = 0;
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("levels")));
  bad = enc;
  bad.payload[4] = 9;  // nnz 9 > numel 4
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nnz")));
}

}  // namespace
}  // namespace tern
