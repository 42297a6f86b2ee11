#include "common/chunking.h"

#include "common/crc32.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

v1::TensorBundle BigBundle(size_t tensors, size_t bytes_each) {
  v1::TensorBundle b;
  b.set_run_id("run-1");
  b.set_round(17);
  b.set_sender("peer-3");
  for (size_t t = 0; t < tensors; ++t) {
    auto* nt = b.add_tensors();
    nt->set_name("layer" + std::to_string(t));
    nt->mutable_tensor()->set_codec("none.v1");
    nt->mutable_tensor()->set_numel(bytes_each / 4);
    std::string payload(bytes_each, '\0');
    for (size_t i = 0; i < bytes_each; ++i) payload[i] = static_cast<char>((i * 131 + t) & 0xff);
    nt->mutable_tensor()->set_payload(std::move(payload));
  }
  return b;
}

TEST(Chunking, BundleOfManyMegabytesRoundTripsInChunksOfAtMostOneMiB) {
  const v1::TensorBundle bundle = BigBundle(3, 1500000);
  auto chunks = ChunkBundle(bundle, 99);
  ASSERT_THAT(chunks, IsOk());
  ASSERT_GE(chunks->size(), 5u);
  // The chunks are the serialized bundle cut into full chunks and a remainder.
  std::string joined;
  for (size_t i = 0; i < chunks->size(); ++i) {
    if (i + 1 < chunks->size()) {
      EXPECT_EQ((*chunks)[i].data().size(), kMaxChunkBytes);
    }
    joined += (*chunks)[i].data();
  }
  EXPECT_EQ(joined, bundle.SerializeAsString());
  BundleAssembler assembler(64 << 20);
  for (const auto& c : *chunks) {
    EXPECT_LE(c.data().size(), kMaxChunkBytes);
    ASSERT_THAT(assembler.Add(c), IsOk());
  }
  ASSERT_TRUE(assembler.complete());
  auto out = assembler.Finish();
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->SerializeAsString(), bundle.SerializeAsString());
}

TEST(Chunking, EmptyBundleIsOneLastChunk) {
  auto chunks = ChunkBundle(v1::TensorBundle(), 1);
  ASSERT_THAT(chunks, IsOk());
  ASSERT_EQ(chunks->size(), 1u);
  BundleAssembler a(1024);
  ASSERT_THAT(a.Add((*chunks)[0]), IsOk());
  EXPECT_THAT(a.Finish(), IsOk());
}

class ChunkingCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    auto chunks = ChunkBundle(BigBundle(1, 300000), 5, 100000);
    ASSERT_THAT(chunks, IsOk());
    chunks_ = *chunks;
    ASSERT_EQ(chunks_.size(), 4u);
  }
  absl::Status Feed(const std::vector<v1::BundleChunk>& chunks, uint64_t limit = 1 << 20) {
    BundleAssembler a(limit);
    for (const auto& c : chunks) {
      if (absl::Status s = a.Add(c); !s.ok()) return s;
    }
    if (!a.complete()) return absl::UnavailableError("incomplete");
    return a.Finish().status();
  }
  std::vector<v1::BundleChunk> chunks_;
};

TEST_F(ChunkingCorruption, MissingChunkIsAGap) {
  chunks_.erase(chunks_.begin() + 1);
  EXPECT_THAT(Feed(chunks_), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("offset")));
}

TEST_F(ChunkingCorruption, ReorderedChunksAreRejected) {
  std::swap(chunks_[1], chunks_[2]);
  EXPECT_THAT(Feed(chunks_), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(ChunkingCorruption, FlippedByteFailsTheChunkCrc) {
  (*chunks_[2].mutable_data())[10] ^= 0x40;
  EXPECT_THAT(Feed(chunks_), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("CRC")));
}

// The data is parsed as its CRC is computed; corruption that also breaks the parse is still
// reported as what it is.
TEST_F(ChunkingCorruption, CorruptionThatBreaksTheParseIsReportedAsACrcFailure) {
  (*chunks_[0].mutable_data())[0] = 0x0b;  // field 1 as a group: the parser refuses it at once
  EXPECT_THAT(Feed(chunks_), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("CRC")));
}

TEST_F(ChunkingCorruption, FlippedByteWithRecomputedChunkCrcFailsTheBundleCrc) {
  (*chunks_[2].mutable_data())[10] ^= 0x40;
  chunks_[2].set_data_crc32(Crc32(chunks_[2].data().data(), chunks_[2].data().size()));
  EXPECT_THAT(Feed(chunks_), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bundle")));
}

TEST_F(ChunkingCorruption, OversizeBundleIsRefusedAtTheFirstChunk) {
  EXPECT_THAT(Feed(chunks_, /*limit=*/1000),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds the limit")));
}

TEST_F(ChunkingCorruption, ChunkOfAnotherStreamIsRejected) {
  chunks_[1].set_stream_id(6);
  EXPECT_THAT(Feed(chunks_), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stream")));
}

TEST_F(ChunkingCorruption, ChangedTotalSizeIsRejected) {
  chunks_[3].set_total_size(chunks_[3].total_size() + 1);
  EXPECT_THAT(Feed(chunks_), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(ChunkingCorruption, MissingLastFlagLeavesItIncompleteOrRejected) {
  chunks_[3].set_last(false);
  EXPECT_THAT(Feed(chunks_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not marked last")));
}

TEST_F(ChunkingCorruption, ChunkAfterTheLastIsRejected) {
  chunks_.push_back(chunks_.back());
  EXPECT_THAT(Feed(chunks_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("after the last")));
}

TEST_F(ChunkingCorruption, ChunkLargerThanOneMiBIsRejected) {
  v1::BundleChunk c;
  c.set_total_size(4 << 20);
  c.set_data(std::string(kMaxChunkBytes + 1, 'x'));
  c.set_data_crc32(Crc32(c.data().data(), c.data().size()));
  BundleAssembler a(8 << 20);
  EXPECT_THAT(a.Add(c), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds")));
}

TEST_F(ChunkingCorruption, AssemblerStaysFailedAfterAnError) {
  BundleAssembler a(1 << 20);
  v1::BundleChunk bad = chunks_[1];  // offset != 0
  EXPECT_THAT(a.Add(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(a.Add(chunks_[0]), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(Chunking, GarbageThatPassesTheCrcIsRefusedAsNotABundle) {
  const std::string junk = "\xff\xff\xff\xff\xff";
  v1::BundleChunk c;
  c.set_total_size(junk.size());
  c.set_data(junk);
  c.set_data_crc32(Crc32(junk.data(), junk.size()));
  c.set_last(true);
  c.set_bundle_crc32(c.data_crc32());
  BundleAssembler a(1024);
  // Refused as its bytes are parsed, on arrival.
  EXPECT_THAT(a.Add(c), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("longer than 5")));
  EXPECT_FALSE(a.complete());
}

}  // namespace
}  // namespace tern
