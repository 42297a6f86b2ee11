#include "common/bit_io.h"

#include <vector>

#include "common/rng.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

TEST(BitIo, GammaRiceAndFixedFieldsRoundTrip) {
  std::string buf;
  BitWriter w(&buf);
  std::vector<uint64_t> gammas, rices, fixed;
  const RngKey key = MakeRngKey(1);
  for (uint32_t i = 0; i < 5000; ++i) {
    const uint32_t r = Random32(key, i);
    gammas.push_back(1 + (uint64_t{r} >> (r % 32)));
    rices.push_back(r % 5000);
    fixed.push_back(r & 0x1fff);
    w.WriteGamma(gammas.back());
    w.WriteRice(rices.back(), 6);
    w.Write(fixed.back(), 13);
  }
  w.WriteGamma(uint64_t{1} << 40);  // more than 32 significant bits
  const uint64_t bits = w.Finish();
  EXPECT_EQ(buf.size(), (bits + 7) / 8);
  BitReader r(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
  for (size_t i = 0; i < gammas.size(); ++i) {
    uint64_t g, q, f;
    ASSERT_TRUE(r.ReadGamma(63, &g));
    ASSERT_TRUE(r.ReadRice(6, 1 << 20, &q));
    ASSERT_TRUE(r.Read(13, &f));
    ASSERT_EQ(g, gammas[i]);
    ASSERT_EQ(q, rices[i]);
    ASSERT_EQ(f, fixed[i]);
  }
  uint64_t big;
  ASSERT_TRUE(r.ReadGamma(63, &big));
  EXPECT_EQ(big, uint64_t{1} << 40);
  EXPECT_TRUE(r.AtCanonicalEnd());
}

TEST(BitIo, ReadsPastTheEndFail) {
  const uint8_t data[2] = {0xff, 0x01};
  BitReader r(data, 2);
  uint64_t v;
  EXPECT_TRUE(r.Read(9, &v));
  EXPECT_EQ(v, 0x1ffu);
  EXPECT_FALSE(r.Read(8, &v));  // only 7 bits left
  EXPECT_TRUE(r.Read(7, &v));
  EXPECT_FALSE(r.Read(1, &v));
}

TEST(BitIo, UnaryRunsLongerThanTheLimitOrTheStreamFail) {
  std::vector<uint8_t> zeros(64, 0);
  BitReader r(zeros.data(), zeros.size());
  uint64_t n;
  EXPECT_FALSE(r.ReadUnary(1000, &n));  // stream ends before the terminating one
  std::string buf;
  BitWriter w(&buf);
  w.WriteUnary(300);
  w.Finish();
  BitReader r2(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
  EXPECT_FALSE(r2.ReadUnary(299, &n));
  BitReader r3(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
  ASSERT_TRUE(r3.ReadUnary(300, &n));
  EXPECT_EQ(n, 300u);
}

TEST(BitIo, GammaRejectsTooManySignificantBits) {
  std::string buf;
  BitWriter w(&buf);
  w.WriteGamma(uint64_t{1} << 33);
  w.Finish();
  BitReader r(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
  uint64_t v;
  EXPECT_FALSE(r.ReadGamma(33, &v));
}

TEST(BitIo, CanonicalEndRejectsNonZeroPaddingAndWholeBytes) {
  const uint8_t one[1] = {0x80};
  BitReader r(one, 1);
  uint64_t v;
  ASSERT_TRUE(r.Read(1, &v));
  EXPECT_FALSE(r.AtCanonicalEnd());  // the 7 padding bits hold a one
  const uint8_t two[2] = {0, 0};
  BitReader r2(two, 2);
  EXPECT_FALSE(r2.AtCanonicalEnd());  // a whole unread byte
}

}  // namespace
}  // namespace tern
