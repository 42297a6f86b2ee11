#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Codec> MakeFp4(const std::string& spec) {
  auto codec = NewBuiltinCodecRegistry()->Create(spec);
  EXPECT_THAT(codec, IsOk());
  return codec.ok() ? *std::move(codec) : nullptr;
}

std::vector<float> Fp4RoundTrip(Codec& codec, const std::vector<float>& x, EncodedTensor* enc,
                                uint64_t seed = 1) {
  EncodeOptions o;
  o.seed = seed;
  EXPECT_THAT(codec.Encode(x, o, enc), IsOk());
  std::vector<float> y(x.size());
  EXPECT_THAT(codec.Decode(EncodedView::Of(*enc), absl::MakeSpan(y)), IsOk());
  return y;
}

TEST(Fp4Codec, E3M0RoundsToTheNearestPowerOfTwoOfTheBlocksMax) {
  auto codec = MakeFp4("fp4");
  EncodedTensor enc;
  // Max 8: magnitudes 8 · {0, 2^-6, ..., 1/2, 1}; 3 sits on the midpoint of 2 and 4 and rounds
  // up, 0.06 is under half of 8/64 and goes to zero, with no sign.
  const auto y = Fp4RoundTrip(*codec, {8, 4, 3, 2.9f, 0.1f, -0.06f, 0, -8}, &enc);
  EXPECT_THAT(y, ElementsAre(8, 4, 4, 2, 0.125f, 0, 0, -8));
  EXPECT_THAT(enc.scales, ElementsAre(8));
  EXPECT_EQ(enc.codec, "fp4.v1");
  EXPECT_EQ(enc.params, "block=128,element=e3m0,round=nearest");
  EXPECT_EQ(enc.payload.size(), 5u + 4u);  // header, 8 codes in 4 bytes
}

TEST(Fp4Codec, E2M1HasTheMicroscalingElementsValues) {
  auto codec = MakeFp4("fp4:element=e2m1");
  EncodedTensor enc;
  // Max 6: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
  EXPECT_THAT(Fp4RoundTrip(*codec, {6, 4.9f, 1.2f, -0.3f, 2.6f}, &enc),
              ElementsAre(6, 4, 1, -0.5f, 3));
}

TEST(Fp4Codec, EachBlockHasItsOwnScaleAndOddBlocksShareBytes) {
  auto codec = MakeFp4("fp4:block=3");
  EncodedTensor enc;
  const auto y = Fp4RoundTrip(*codec, {1, 0.5f, -0.25f, 64, -32, 16, 0.001f}, &enc);
  EXPECT_THAT(enc.scales, ElementsAre(1, 64, 0.001f));
  EXPECT_THAT(y, ElementsAre(1, 0.5f, -0.25f, 64, -32, 16, 0.001f));
  EXPECT_EQ(enc.payload.size(), 5u + 4u);  // 7 codes, the last byte's high nibble zero
}

TEST(Fp4Codec, StochasticRoundingIsUnbiased) {
  auto codec = MakeFp4("fp4:round=stochastic,block=100000");
  // 0.3 of the max lies between 0.25 and 0.5: up with probability 0.2.
  std::vector<float> x(20001, 0.3f);
  x[0] = 1;
  EncodedTensor enc;
  const auto y = Fp4RoundTrip(*codec, x, &enc, 7);
  double mean = 0;
  int up = 0;
  for (size_t i = 1; i < y.size(); ++i) {
    ASSERT_TRUE(y[i] == 0.25f || y[i] == 0.5f) << y[i];
    mean += y[i] / 20000.0;
    up += y[i] == 0.5f;
  }
  EXPECT_NEAR(mean, 0.3, 0.003);
  EXPECT_NEAR(up / 20000.0, 0.2, 0.015);
}

TEST(Fp4Codec, ANanEncodesAsZeroAndTheBlockKeepsItsScale) {
  auto codec = MakeFp4("fp4");
  EncodedTensor enc;
  EXPECT_THAT(Fp4RoundTrip(*codec, {2, NAN, -1}, &enc), ElementsAre(2, 0, -1));
  EXPECT_THAT(enc.scales, ElementsAre(2));
}

TEST(Fp4Codec, AccumulateAddsTheWeightedValues) {
  auto codec = MakeFp4("fp4");
  EncodedTensor enc;
  ASSERT_THAT(codec->Encode(std::vector<float>{4, -2, 1}, {}, &enc), IsOk());
  std::vector<float> out = {1, 1, 1};
  ASSERT_THAT(codec->DecodeAccumulate(EncodedView::Of(enc), 0.5f, absl::MakeSpan(out)), IsOk());
  EXPECT_THAT(out, ElementsAre(3, 0, 1.5f));
}

TEST(Fp4Codec, MalformedPayloadsAreRefusedWithTheReason) {
  auto codec = MakeFp4("fp4:block=4");
  EncodedTensor good;
  ASSERT_THAT(codec->Encode(std::vector<float>{1, -1, 0.5f, 0.25f, 2}, {}, &good), IsOk());
  std::vector<float> out(5);
  auto refused = [&](EncodedTensor t, const std::string& why) {
    EXPECT_THAT(codec->Decode(EncodedView::Of(t), absl::MakeSpan(out)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(why)))
        << why;
  };
  EncodedTensor t = good;
  t.payload[5] = static_cast<char>(0x08);  // -0 in the low nibble
  refused(t, "negative zero");
  t = good;
  t.payload.back() = static_cast<char>(t.payload.back() | 0x10);  // the padding nibble
  refused(t, "padding");
  t = good;
  t.payload[4] = 2;
  refused(t, "element format");
  t = good;
  t.payload[0] = t.payload[1] = t.payload[2] = t.payload[3] = 0;
  refused(t, "block size 0");
  t = good;
  t.payload.pop_back();
  refused(t, "code bytes");
  t = good;
  t.payload.resize(3);
  refused(t, "truncated header");
  t = good;
  t.scales.pop_back();
  refused(t, "scale");
  t = good;
  t.scales[0] = -1;
  refused(t, "scale");
}

TEST(Fp4Codec, BadSpecsSayWhatIsAllowed) {
  auto registry = NewBuiltinCodecRegistry();
  EXPECT_THAT(registry->Create("fp4:element=e4m3").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("e2m1")));
  EXPECT_FALSE(registry->Create("fp4:block=0").ok());
  EXPECT_FALSE(registry->Create("fp4:round=up").ok());
}

}  // namespace
}  // namespace tern
