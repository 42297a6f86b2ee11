#include "common/byte_io.h"

#include "gtest/gtest.h"

namespace tern {
namespace {

TEST(ByteIo, FixedWidthRoundTripLittleEndian) {
  std::string buf;
  ByteWriter w(&buf);
  w.U8(0xab);
  w.U16(0x1234);
  w.U32(0xdeadbeef);
  w.U64(0x0102030405060708ULL);
  w.F32(1.5f);
  ASSERT_EQ(buf.size(), 19u);
  EXPECT_EQ(static_cast<uint8_t>(buf[1]), 0x34);  // little-endian
  ByteReader r(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
  uint8_t a;
  uint16_t b;
  uint32_t c;
  uint64_t d;
  float f;
  ASSERT_TRUE(r.U8(&a) && r.U16(&b) && r.U32(&c) && r.U64(&d) && r.F32(&f));
  EXPECT_EQ(a, 0xab);
  EXPECT_EQ(b, 0x1234);
  EXPECT_EQ(c, 0xdeadbeefu);
  EXPECT_EQ(d, 0x0102030405060708ULL);
  EXPECT_EQ(f, 1.5f);
  EXPECT_EQ(r.remaining(), 0u);
}

TEST(ByteIo, TruncatedReadsFailWithoutAdvancing) {
  const uint8_t data[3] = {1, 2, 3};
  ByteReader r(data, 3);
  uint32_t v;
  EXPECT_FALSE(r.U32(&v));
  EXPECT_EQ(r.remaining(), 3u);
  EXPECT_EQ(r.Take(4), nullptr);
  EXPECT_NE(r.Take(3), nullptr);
  EXPECT_EQ(r.Take(1), nullptr);
}

}  // namespace
}  // namespace tern
