#include "core/federated/shamir.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::StatusIs;

Key32 SomeSecret() {
  Key32 k;
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(0xf0 ^ (i * 37));
  k[31] = 0xff;  // the last piece at its widest
  return k;
}

TEST(Shamir, EveryThreeOfSixSharesRebuildTheSecret) {
  const Key32 secret = SomeSecret();
  const std::vector<uint64_t> xs = {1, 2, 5, 9, 100, (uint64_t{1} << 61) - 2};
  absl::StatusOr<std::vector<ShamirShare>> shares = ShamirSplit(secret, 3, xs);
  ASSERT_TRUE(shares.ok()) << shares.status();
  for (size_t a = 0; a < 6; ++a) {
    for (size_t b = a + 1; b < 6; ++b) {
      for (size_t c = b + 1; c < 6; ++c) {
        const std::vector<ShamirShare> some = {(*shares)[a], (*shares)[b], (*shares)[c]};
        absl::StatusOr<Key32> got = ShamirCombine(some, 3);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, secret);
      }
    }
  }
  absl::StatusOr<Key32> all = ShamirCombine(*shares, 3);  // extras checked, and consistent
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, secret);
}

TEST(Shamir, TwoSharesOfAThresholdOfThreeAreRefusedAndSayNothing) {
  const Key32 secret = SomeSecret();
  absl::StatusOr<std::vector<ShamirShare>> shares = ShamirSplit(secret, 3, {1, 2, 3});
  ASSERT_TRUE(shares.ok());
  const std::vector<ShamirShare> two = {(*shares)[0], (*shares)[1]};
  EXPECT_THAT(ShamirCombine(two, 3), StatusIs(absl::StatusCode::kFailedPrecondition));
  // Read as a threshold of 2, the two shares give a line through them: not the secret.
  absl::StatusOr<Key32> guess = ShamirCombine(two, 2);
  EXPECT_TRUE(!guess.ok() || *guess != secret);
  // Two splits of one secret share nothing: the same points carry different values.
  absl::StatusOr<std::vector<ShamirShare>> again = ShamirSplit(secret, 3, {1, 2, 3});
  ASSERT_TRUE(again.ok());
  EXPECT_NE((*again)[0].y, (*shares)[0].y);
}

TEST(Shamir, AShareThatDisagreesWithTheOthersIsDataLoss) {
  absl::StatusOr<std::vector<ShamirShare>> shares = ShamirSplit(SomeSecret(), 2, {1, 2, 3, 4});
  ASSERT_TRUE(shares.ok());
  (*shares)[3].y[2] ^= 1;
  EXPECT_THAT(ShamirCombine(*shares, 2), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(Shamir, SplitRefusesABadThresholdOrPoints) {
  const Key32 s = SomeSecret();
  EXPECT_THAT(ShamirSplit(s, 0, {1, 2}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ShamirSplit(s, 3, {1, 2}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ShamirSplit(s, 2, {1, 1}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ShamirSplit(s, 1, {0}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ShamirSplit(s, 1, {(uint64_t{1} << 61) - 1}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ShamirShareBytes, RoundTripAndRefuseTruncatedOversizedOrOutOfField) {
  absl::StatusOr<std::vector<ShamirShare>> shares = ShamirSplit(SomeSecret(), 2, {7, 8});
  ASSERT_TRUE(shares.ok());
  const std::string bytes = EncodeShamirShare((*shares)[0]);
  ASSERT_EQ(bytes.size(), kShamirShareBytes);
  absl::StatusOr<ShamirShare> back = DecodeShamirShare(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->x, 7u);
  EXPECT_EQ(back->y, (*shares)[0].y);
  EXPECT_THAT(DecodeShamirShare(bytes.substr(0, 47)), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(DecodeShamirShare(bytes + "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  std::string zero_x = bytes;
  for (int i = 0; i < 8; ++i) zero_x[static_cast<size_t>(i)] = 0;
  EXPECT_THAT(DecodeShamirShare(zero_x), StatusIs(absl::StatusCode::kInvalidArgument));
  std::string big = bytes;
  big[15] = static_cast<char>(0xff);  // the first value's top byte: >= 2^61 - 1
  EXPECT_THAT(DecodeShamirShare(big), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
