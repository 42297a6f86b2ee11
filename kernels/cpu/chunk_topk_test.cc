#include <cmath>
#include <cstring>
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

std::unique_ptr<Codec> MakeChunkTopK(const std::string& spec) {
  auto codec = NewBuiltinCodecRegistry()->Create(spec);
  EXPECT_THAT(codec, IsOk());
  return codec.ok() ? *std::move(codec) : nullptr;
}

std::vector<float> ChunkTopKRoundTrip(Codec& codec, const std::vector<float>& x,
                                      EncodedTensor* enc) {
  EXPECT_THAT(codec.Encode(x, {}, enc), IsOk());
  std::vector<float> y(x.size(), 99.0f);  // Decode overwrites every value
  EXPECT_THAT(codec.Decode(EncodedView::Of(*enc), absl::MakeSpan(y)), IsOk());
  return y;
}

TEST(ChunkTopKCodec, EachChunkKeepsItsLargestWithTwoLevelsOfMagnitude) {
  auto codec = MakeChunkTopK("chunk-topk:chunk=4,k=2,bits=2");
  EncodedTensor enc;
  // Chunks [1 -4 3 .5] [10 0 -2 8] [7]: two levels each, the lower group's mean and the upper's;
  // the last chunk's one value goes in the upper group, the empty lower one repeats 0.
  const auto y = ChunkTopKRoundTrip(*codec, {1, -4, 3, 0.5f, 10, 0, -2, 8, 7}, &enc);
  EXPECT_THAT(y, ElementsAre(0, -4, 3, 0, 10, 0, 0, 8, 7));
  EXPECT_THAT(enc.scales, ElementsAre(3, 4, 8, 10, 0, 7));
  EXPECT_EQ(enc.codec, "chunk-topk.v1");
  EXPECT_EQ(enc.params, "chunk=4,k=2,bits=2");
  EXPECT_EQ(enc.payload.size(), 9u + 2 * 5 + 2);  // header, 5 u16 indices, 10 bits of codes
}

TEST(ChunkTopKCodec, OneBitSendsTheSignsAndTheMeanKeptMagnitude) {
  auto codec = MakeChunkTopK("chunk-topk:chunk=4,k=2,bits=1");
  EncodedTensor enc;
  EXPECT_THAT(ChunkTopKRoundTrip(*codec, {1, -4, 3, 0.5f}, &enc), ElementsAre(0, -3.5f, 3.5f, 0));
}

TEST(ChunkTopKCodec, TwoBitsAtTwoPercentCostUnderHalfABitAValue) {
  auto codec = MakeChunkTopK("chunk-topk:ratio=0.015625");  // k = 64 of 4096
  std::vector<float> x(10000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1000) - 500.0f;
  EncodedTensor enc;
  ASSERT_THAT(codec->Encode(x, {}, &enc), IsOk());
  EXPECT_EQ(enc.params, "chunk=4096,k=64,bits=2");
  EXPECT_EQ(enc.payload.size(), 9u + 2 * 192 + 48);  // 3 chunks of 64
  EXPECT_EQ(enc.scales.size(), 6u);
  EXPECT_LT(8.0 * static_cast<double>(enc.ByteSize()) / x.size(), 0.4);
}

TEST(ChunkTopKCodec, AccumulateAddsOnlyTheKeptValues) {
  auto codec = MakeChunkTopK("chunk-topk:chunk=4,k=1,bits=1");
  EncodedTensor enc;
  ASSERT_THAT(codec->Encode(std::vector<float>{1, -4, 3, 0.5f}, {}, &enc), IsOk());
  std::vector<float> out = {1, 1, 1, 1};
  ASSERT_THAT(codec->DecodeAccumulate(EncodedView::Of(enc), 0.5f, absl::MakeSpan(out)), IsOk());
  EXPECT_THAT(out, ElementsAre(1, -1, 1, 1));
}

TEST(ChunkTopKCodec, MalformedPayloadsAreRefusedWithTheReason) {
  auto codec = MakeChunkTopK("chunk-topk:chunk=4,k=2,bits=3");
  EncodedTensor good;
  ASSERT_THAT(codec->Encode(std::vector<float>{1, -4, 3, 0.5f, 2}, {}, &good), IsOk());
  std::vector<float> out(5);
  auto refused = [&](EncodedTensor t, const std::string& why) {
    EXPECT_THAT(codec->Decode(EncodedView::Of(t), absl::MakeSpan(out)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(why)))
        << why;
  };
  const uint16_t two = 2, nine = 9;
  EncodedTensor t = good;  // indices of chunk 0 are 1, 2: make them 2, 2
  std::memcpy(t.payload.data() + 9, &two, 2);
  refused(t, "out of order");
  t = good;  // chunk 1 holds one value: index 9 is past it
  std::memcpy(t.payload.data() + 9 + 4, &nine, 2);
  refused(t, "past the chunk");
  t = good;  // 3 codes of 3 bits: 9 bits, the second byte's high 7 are padding
  t.payload.back() = static_cast<char>(t.payload.back() | 0x80);
  refused(t, "padding");
  t = good;
  t.payload[4] = 5;  // k 5 > chunk 4
  refused(t, "need 1 <= k <= chunk");
  t = good;
  t.payload.pop_back();
  refused(t, "indices and codes");
  t = good;
  t.payload.resize(8);
  refused(t, "truncated header");
  t = good;
  t.scales.pop_back();
  refused(t, "scales");
  t = good;
  t.scales[1] = -1;
  refused(t, "scale 1");
}

TEST(ChunkTopKCodec, BadSpecsSayWhatIsAllowed) {
  auto registry = NewBuiltinCodecRegistry();
  EXPECT_THAT(registry->Create("chunk-topk:chunk=8,k=9").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than chunk")));
  EXPECT_THAT(registry->Create("chunk-topk:k=4,ratio=0.1").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not both")));
  EXPECT_FALSE(registry->Create("chunk-topk:chunk=70000").ok());
  EXPECT_FALSE(registry->Create("chunk-topk:bits=9").ok());
  auto c = registry->Create("chunk-topk:chunk=1000,ratio=0.02");
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ((*c)->Spec(), "chunk-topk:chunk=1000,k=20,bits=2");
}

TEST(ChunkTopKCodec, ANonFiniteValueIsAnEncodeError) {
  auto codec = MakeChunkTopK("chunk-topk:chunk=4,k=1");
  EncodedTensor enc;
  EXPECT_THAT(codec->Encode(std::vector<float>{1, NAN, 0, 0}, {}, &enc),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-finite")));
}

}  // namespace
}  // namespace tern
