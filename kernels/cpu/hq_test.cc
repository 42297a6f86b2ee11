// hq.v1: the tiers, the grids, unbiasedness, the bits it spends and what its decoder refuses.
#include "kernels/cpu/hq.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/format/hq.h"
#include "kernels/format/sparse.h"
#include "kernels/select.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<Codec> NewHq(const std::string& spec) {
  auto codec = NewBuiltinCodecRegistry()->Create(spec);
  EXPECT_THAT(codec, IsOk()) << spec;
  return codec.ok() ? std::move(*codec) : nullptr;
}

EncodedTensor EncodeHq(Codec& c, const std::vector<float>& x, uint64_t seed = 1) {
  EncodedTensor e;
  EncodeOptions o;
  o.seed = seed;
  EXPECT_THAT(c.Encode(x, o, &e), IsOk());
  return e;
}

std::vector<float> DecodeHq(const Codec& c, const EncodedTensor& e) {
  std::vector<float> y(e.numel);
  EXPECT_THAT(c.Decode(EncodedView::Of(e), absl::MakeSpan(y)), IsOk());
  return y;
}

// Heavy-tailed values, as a selected update's are: a Gaussian cubed.
std::vector<float> HeavyTailed(size_t n, uint64_t seed) {
  std::vector<float> x = testing::Gaussian(n, seed);
  for (float& v : x) v = v * v * v;
  return x;
}

double HqRelError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += double(got[i] - want[i]) * (got[i] - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

// The input where top-k keeps it, zero elsewhere: what hq quantizes.
std::vector<float> Selected(const std::vector<float>& x, double ratio) {
  std::vector<uint32_t> idx;
  SelectTopK(x, format::SparseK(ratio, x.size()), &idx);
  std::vector<float> s(x.size(), 0.0f);
  for (uint32_t i : idx) s[i] = x[i];
  return s;
}

TEST(HqCodec, TiersDoubleInCountDownwardAndEachGridSpansItsTier) {
  auto hq = NewHq("hq:ratio=0.1,bits=6-4-3-2");
  ASSERT_NE(hq, nullptr);
  EXPECT_EQ(hq->Spec(), "hq:ratio=0.1,bits=6-4-3-2");
  const std::vector<float> x = HeavyTailed(30000, 5);
  const EncodedTensor e = EncodeHq(*hq, x);
  EXPECT_EQ(e.codec, "hq.v1");
  ASSERT_EQ(e.scales.size(), 8u);
  // Tier 0 the largest: each grid [lo, hi] sits above the next tier's.
  for (int t = 0; t + 1 < 4; ++t) EXPECT_GE(e.scales[2 * t], e.scales[2 * t + 3]) << t;
  // Counts by tier, read off the selected magnitudes: 1, 2, 4 and 8 fifteenths of k = 3000.
  const std::vector<float> s = Selected(x, 0.1);
  int count[4] = {0, 0, 0, 0};
  for (float v : s) {
    if (v == 0) continue;
    const float m = std::fabs(v);
    int t = 0;
    while (t < 3 && m < e.scales[2 * t]) ++t;
    ++count[t];
  }
  EXPECT_EQ(count[0], 200);
  EXPECT_EQ(count[1], 400);
  EXPECT_EQ(count[2], 800);
  EXPECT_EQ(count[3], 1600);
  // Every decoded value is on its tier's grid and off by at most one step.
  const std::vector<float> y = DecodeHq(*hq, e);
  for (size_t i = 0; i < x.size(); ++i) {
    if (s[i] == 0) {
      EXPECT_EQ(y[i], 0.0f) << i;
      continue;
    }
    EXPECT_EQ(std::signbit(y[i]), std::signbit(s[i])) << i;
    const float m = std::fabs(s[i]);
    int t = 0;
    while (t < 3 && m < e.scales[2 * t]) ++t;
    const int bits[4] = {6, 4, 3, 2};
    const float step = format::HqStep(e.scales[2 * t], e.scales[2 * t + 1], bits[t]);
    EXPECT_LE(std::fabs(std::fabs(y[i]) - m), step * 1.0001f + 1e-6f) << i;
  }
}

TEST(HqCodec, TheMeanOfManyEncodesIsTheSelectedInput) {
  auto hq = NewHq("hq:ratio=0.2,bits=3-2");
  const std::vector<float> x = HeavyTailed(2000, 6);
  const std::vector<float> s = Selected(x, 0.2);
  std::vector<double> sum(x.size(), 0.0);
  const int draws = 2000;
  for (int d = 0; d < draws; ++d) {
    const std::vector<float> y = DecodeHq(*hq, EncodeHq(*hq, x, 1000 + d));
    for (size_t i = 0; i < x.size(); ++i) sum[i] += y[i];
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double mean = sum[i] / draws;
    num += (mean - s[i]) * (mean - s[i]);
    den += double(s[i]) * s[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.01);
}

// The paper's point: at equal bits per value (the tier index counted), tiers keep heavy-tailed
// values far more exactly than one grid; every position is sent (ratio 1) or top-k's.
TEST(HqCodec, AtEqualBitsTiersBeatOneGridOnHeavyTailedValues) {
  const std::vector<float> x = HeavyTailed(50000, 7);
  for (double ratio : {0.1, 1.0}) {
    // 2.8 bits a value on average (1/15 at 6, 2/15 at 4, 4/15 at 3, 8/15 at 2) and 2 for its
    // tier: 4.8, against one grid's 5.
    auto tiers = NewHq(absl::StrCat("hq:ratio=", ratio, ",bits=6-4-3-2"));
    auto one = NewHq(absl::StrCat("hq:ratio=", ratio, ",bits=5"));
    const std::vector<float> s = Selected(x, ratio);
    const EncodedTensor et = EncodeHq(*tiers, x), eo = EncodeHq(*one, x);
    EXPECT_LE(et.payload.size(), eo.payload.size()) << ratio;
    const double err_tiers = HqRelError(DecodeHq(*tiers, et), s);
    const double err_one = HqRelError(DecodeHq(*one, eo), s);
    EXPECT_LT(err_tiers, 0.8 * err_one) << ratio << ": " << err_tiers << " vs " << err_one;
  }
}

TEST(HqCodec, ATierIndexOrGridItCouldNotHaveWrittenIsRefused) {
  auto hq = NewHq("hq:ratio=0.5,bits=4-2");
  const std::vector<float> x = testing::Gaussian(64, 8);
  EncodedTensor e = EncodeHq(*hq, x);
  std::vector<float> out(64, 7.0f);
  // An empty grid (lo > hi).
  EncodedTensor bad = e;
  std::swap(bad.scales[0], bad.scales[1]);
  if (bad.scales[0] > bad.scales[1]) {
    EXPECT_THAT(hq->Decode(EncodedView::Of(bad), absl::MakeSpan(out)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  }
  // Bits outside [2, 16], more tiers than allowed, every position with k != numel.
  bad = e;
  bad.payload[5] = 1;
  EXPECT_THAT(hq->Decode(EncodedView::Of(bad), absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bits")));
  bad = e;
  bad.payload[4] = 9;
  EXPECT_THAT(hq->Decode(EncodedView::Of(bad), absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tiers")));
  bad = e;
  bad.payload[7] = static_cast<char>(format::kHqEveryPosition);
  EXPECT_THAT(hq->Decode(EncodedView::Of(bad), absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("every position")));
  // Three tiers' worth of index bits read as two: a tier index of 3 somewhere, or a misread.
  auto three = NewHq("hq:ratio=1,bits=2-2-2");
  EncodedTensor t3 = EncodeHq(*three, x);
  // Set the first element's tier bits (the stream's first two bits) to 3.
  const size_t stream = 4 + 1 + 3 + 1;
  t3.payload[stream] = static_cast<char>(t3.payload[stream] | 3);
  EXPECT_THAT(three->Decode(EncodedView::Of(t3), absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tier 3 of 3")));
  for (float v : out) EXPECT_EQ(v, 7.0f);  // untouched by every refusal
}

TEST(HqCodec, BadSpecsNameWhatIsAllowed) {
  auto registry = NewBuiltinCodecRegistry();
  for (const char* spec : {"hq:bits=1", "hq:bits=17", "hq:bits=2-2-2-2-2-2-2-2-2", "hq:bits=4-x",
                           "hq:bits=", "hq:ratio=0"}) {
    EXPECT_THAT(registry->Create(spec), StatusIs(absl::StatusCode::kInvalidArgument)) << spec;
  }
  EXPECT_THAT(registry->Create("hq:bits=1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("in [2, 16]")));
  std::vector<float> bad = {1.0f, NAN, 2.0f};
  EncodedTensor e;
  EXPECT_THAT(NewHq("hq:ratio=1,bits=4")->Encode(bad, {}, &e),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-finite")));
}

}  // namespace
}  // namespace tern
