#include "core/rpc/raw_chunk.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

v1::BundleChunk Sample(std::mt19937& rng) {
  v1::BundleChunk c;
  const auto maybe = [&rng](uint64_t v) { return rng() % 3 == 0 ? 0 : v; };
  c.set_stream_id(maybe((uint64_t{rng()} << 32) | rng()));
  c.set_offset(maybe(rng() % (1 << 30)));
  c.set_total_size(maybe(rng()));
  c.set_data_crc32(static_cast<uint32_t>(maybe(rng())));
  c.set_last(rng() % 2 == 0);
  c.set_bundle_crc32(static_cast<uint32_t>(maybe(rng())));
  c.set_stripes(static_cast<uint32_t>(maybe(rng() % 20)));
  std::string data(rng() % 3 == 0 ? 0 : rng() % 5000, '\0');
  for (char& b : data) b = static_cast<char>(rng());
  c.set_data(std::move(data));
  return c;
}

std::vector<absl::string_view> Split(const std::string& bytes, std::mt19937& rng) {
  std::vector<absl::string_view> pieces;
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = std::min<size_t>(bytes.size() - at, rng() % 4 == 0 ? 1 : 1 + rng() % 900);
    pieces.push_back(absl::string_view(bytes).substr(at, n));
    at += n;
    if (rng() % 5 == 0) pieces.push_back(absl::string_view());  // gRPC may hand empty slices
  }
  return pieces;
}

// What protobuf reads from the same bytes, as a RawChunk would give it.
void ExpectSame(const RawChunk& got, const v1::BundleChunk& want) {
  EXPECT_EQ(got.header.stream_id, want.stream_id());
  EXPECT_EQ(got.header.offset, want.offset());
  EXPECT_EQ(got.header.total_size, want.total_size());
  EXPECT_EQ(got.header.data_crc32, want.data_crc32());
  EXPECT_EQ(got.header.last, want.last());
  EXPECT_EQ(got.header.bundle_crc32, want.bundle_crc32());
  EXPECT_EQ(got.header.stripes, want.stripes());
  std::string data;
  for (absl::string_view p : got.data) data.append(p.data(), p.size());
  EXPECT_EQ(data, want.data());
  EXPECT_EQ(got.data_size, want.data().size());
}

TEST(RawChunk, ReadsWhatProtobufWritesFromPiecesOfAnySize) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 300; ++trial) {
    const v1::BundleChunk c = Sample(rng);
    const std::string bytes = c.SerializeAsString();
    absl::StatusOr<RawChunk> got = ParseRawChunkPieces(Split(bytes, rng));
    ASSERT_THAT(got, IsOk());
    ExpectSame(*got, c);
    EXPECT_EQ(got->message_size, bytes.size());
  }
}

TEST(RawChunk, UnknownFieldsAndKnownOnesOfAnotherWireTypeAreSkippedAsProtobufSkipsThem) {
  // offset as a length-delimited field (unknown to protobuf: skipped), an unknown fixed32 and
  // fixed64, then two data fields (the last wins) and total_size.
  const std::string bytes = std::string("\x12\x02zz", 4) + std::string("\x45\x01\x02\x03\x04", 5) +
                            std::string("\x49\x01\x02\x03\x04\x05\x06\x07\x08", 9) +
                            std::string("\x22\x02", 2) + "ab" + std::string("\x22\x03", 2) + "xyz" +
                            std::string("\x18\x2a", 2);
  v1::BundleChunk want;
  ASSERT_TRUE(want.ParseFromString(bytes));
  std::mt19937 rng(2);
  absl::StatusOr<RawChunk> got = ParseRawChunkPieces(Split(bytes, rng));
  ASSERT_THAT(got, IsOk());
  ExpectSame(*got, want);
  EXPECT_EQ(want.data(), "xyz");
}

TEST(RawChunk, AFiveByteTagLosesItsBitsPast32AsInProtobuf) {
  // Found by fuzz_raw_chunk: protobuf reads this tag as field 33554431, fixed32.
  const std::string bytes("\xfd\xff\xff\xff\x60\x60\x60\x60\x98", 9);
  v1::BundleChunk want;
  ASSERT_TRUE(want.ParseFromString(bytes));
  absl::StatusOr<RawChunk> got = ParseRawChunkPieces({bytes});
  ASSERT_THAT(got, IsOk());
  ExpectSame(*got, want);
}

TEST(RawChunk, CorruptOrTruncatedBytesAreNeverReadOtherwiseThanProtobufReadsThem) {
  std::mt19937 rng(3);
  int refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = Sample(rng).SerializeAsString();
    if (bytes.empty()) continue;
    if (trial % 2 == 0) {
      bytes[rng() % std::min<size_t>(bytes.size(), 40)] = static_cast<char>(rng());
    } else {
      bytes.resize(rng() % bytes.size());
    }
    v1::BundleChunk want;
    const bool ok = want.ParseFromString(bytes);
    absl::StatusOr<RawChunk> got = ParseRawChunkPieces(Split(bytes, rng));
    ASSERT_EQ(got.ok(), ok) << "trial " << trial;
    if (ok) {
      ExpectSame(*got, want);
    } else {
      EXPECT_THAT(got, StatusIs(absl::StatusCode::kInvalidArgument));
      ++refused;
    }
  }
  EXPECT_GT(refused, 100);
}

TEST(RawChunk, AMessageCarriesTheChunksDataWithoutACopyAndProtobufReadsIt) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 50; ++trial) {
    auto chunk = std::make_shared<v1::BundleChunk>(Sample(rng));
    grpc::ByteBuffer message = RawChunkMessage(*chunk, chunk);
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(message.Dump(&slices).ok());
    std::string bytes;
    bool in_place = chunk->data().empty();
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      in_place |= reinterpret_cast<const char*>(s.begin()) == chunk->data().data();
    }
    EXPECT_TRUE(in_place) << "the data slice is not the chunk's own memory";
    v1::BundleChunk back;
    ASSERT_TRUE(back.ParseFromString(bytes));
    EXPECT_EQ(back.SerializeAsString(), chunk->SerializeAsString());
    absl::StatusOr<RawChunk> raw = ParseRawChunk(message);
    ASSERT_THAT(raw, IsOk());
    ExpectSame(*raw, *chunk);
  }
}

TEST(RawChunk, AStripedPushWritesItsOwnStreamIdAndStripesOverTheChunks) {
  std::mt19937 rng(5);
  auto chunk = std::make_shared<v1::BundleChunk>(Sample(rng));
  const ChunkStripe stripe{0x1234567890abcdefu, 3};
  absl::StatusOr<RawChunk> raw = ParseRawChunk(RawChunkMessage(*chunk, chunk, &stripe));
  ASSERT_THAT(raw, IsOk());
  v1::BundleChunk want = *chunk;
  want.set_stream_id(stripe.stream_id);
  want.set_stripes(stripe.stripes);
  ExpectSame(*raw, want);
}

TEST(RawChunk, TheMessageKeepsItsOwnerAliveUntilGrpcIsDone) {
  auto chunk = std::make_shared<v1::BundleChunk>();
  chunk->set_data(std::string(1000, 'd'));
  std::weak_ptr<v1::BundleChunk> watch = chunk;
  {
    grpc::ByteBuffer message = RawChunkMessage(*chunk, chunk);
    chunk.reset();
    EXPECT_FALSE(watch.expired());
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(message.Dump(&slices).ok());
  }
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace tern
