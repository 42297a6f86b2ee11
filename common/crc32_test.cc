#include "common/crc32.h"

#include <zlib.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tern {
namespace {

TEST(Crc32, MatchesTheStandardCheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(Crc32(s.data(), s.size()), 0xCBF43926u);  // CRC-32/ISO-HDLC check value
  EXPECT_EQ(Crc32(nullptr, 0), 0u);
}

TEST(Crc32, EqualsZlibAtEveryLengthAndContinuesAcrossPieces) {
  std::vector<unsigned char> b(5000);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>(i * 131 + (i >> 7));
  for (size_t n : {1, 3, 15, 16, 17, 63, 64, 65, 255, 256, 1000, 4999, 5000}) {
    const uint32_t want = static_cast<uint32_t>(crc32(0, b.data(), static_cast<uInt>(n)));
    ASSERT_EQ(Crc32(b.data(), n), want) << n;
    const size_t cut = n / 3;
    EXPECT_EQ(Crc32(b.data() + cut, n - cut, Crc32(b.data(), cut)), want) << n;
    EXPECT_EQ(Crc32Combine(Crc32(b.data(), cut), Crc32(b.data() + cut, n - cut), n - cut), want)
        << n;
  }
}

}  // namespace
}  // namespace tern
