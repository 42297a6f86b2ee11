#include "common/bundle_stream.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

v1::TensorBundle Sample(uint32_t seed) {
  std::mt19937 rng(seed);
  v1::TensorBundle b;
  b.set_run_id("run-" + std::to_string(seed));
  b.set_round(rng() % 100000);
  b.set_sender("peer-" + std::to_string(rng() % 9));
  const int tensors = static_cast<int>(rng() % 4);
  for (int t = 0; t < tensors; ++t) {
    v1::NamedTensor* nt = b.add_tensors();
    nt->set_name("layer." + std::to_string(t));
    if (rng() % 5 == 0) continue;  // a NamedTensor without its tensor
    v1::EncodedTensor* et = nt->mutable_tensor();
    et->set_codec(rng() % 2 ? "none.v1" : "stc.v1");
    et->set_params("ratio=0.01");
    const uint64_t numel = rng() % 3000;
    et->set_numel(numel);
    et->add_shape(static_cast<int64_t>(numel));
    et->add_shape(1);
    et->set_dtype(v1::DTYPE_FLOAT32);
    for (int s = 0; s < static_cast<int>(rng() % 3); ++s) et->add_scales(0.5f * s - 1.0f);
    std::string payload(rng() % 5000, '\0');
    for (char& c : payload) c = static_cast<char>(rng());
    et->set_payload(std::move(payload));
  }
  return b;
}

// Feeds `bytes` in pieces of `piece` bytes (0: random sizes) to a parser told `total`.
absl::StatusOr<v1::TensorBundle> Parse(const std::string& bytes, size_t piece, uint64_t total,
                                       uint32_t seed = 1) {
  BundleStreamParser p(total);
  std::mt19937 rng(seed);
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = std::min(bytes.size() - at, piece > 0 ? piece : 1 + rng() % 700);
    if (absl::Status s = p.Feed(absl::string_view(bytes).substr(at, n)); !s.ok()) return s;
    at += n;
  }
  return p.Finish();
}

absl::StatusOr<v1::TensorBundle> Parse(const std::string& bytes, size_t piece = 0) {
  return Parse(bytes, piece, bytes.size());
}

TEST(BundleStream, ReadsWhatProtobufWritesInPiecesOfAnySize) {
  for (uint32_t seed = 0; seed < 40; ++seed) {
    const v1::TensorBundle b = Sample(seed);
    const std::string bytes = b.SerializeAsString();
    for (size_t piece : {size_t{0}, size_t{1}, size_t{3}, size_t{64}, bytes.size() + 1}) {
      absl::StatusOr<v1::TensorBundle> got = Parse(bytes, piece);
      ASSERT_THAT(got, IsOk()) << "seed " << seed << " piece " << piece;
      EXPECT_TRUE(MessageDifferencer::Equals(*got, b)) << "seed " << seed << " piece " << piece;
    }
  }
}

TEST(BundleStream, AnEmptyBundleAndEmptyPayloadsRoundTrip) {
  EXPECT_TRUE(MessageDifferencer::Equals(*Parse(""), v1::TensorBundle()));
  v1::TensorBundle b;
  b.add_tensors()->mutable_tensor()->set_payload("");
  b.add_tensors()->mutable_tensor()->set_codec("none.v1");
  b.add_tensors();
  absl::StatusOr<v1::TensorBundle> got = Parse(b.SerializeAsString(), 1);
  ASSERT_THAT(got, IsOk());
  EXPECT_TRUE(MessageDifferencer::Equals(*got, b));
}

TEST(BundleStream, FieldsInAnyOrderAndUnknownFieldsReadAsProtobufReadsThem) {
  // payload first, then codec; an unknown varint, fixed32, fixed64 and bytes field at each level.
  const std::string encoded =
      std::string("\x3a\x03xyz", 5) + "\x0a\x07none.v1" + std::string("\x48\x96\x01", 3) +
      std::string("\x55\x01\x02\x03\x04", 5) +
      std::string("\x59\x01\x02\x03\x04\x05\x06\x07\x08", 9) + std::string("\x62\x02hi", 4);
  const std::string named = std::string("\x12", 1) + static_cast<char>(encoded.size()) + encoded +
                            "\x0a\x01w" + std::string("\x18\x05", 2);
  const std::string bytes = std::string("\x22", 1) + static_cast<char>(named.size()) + named +
                            "\x0a\x03run" + std::string("\x10\x07", 2) +
                            std::string("\x6a\x01z", 3);
  v1::TensorBundle want;
  ASSERT_TRUE(want.ParseFromString(bytes));
  ASSERT_EQ(want.tensors(0).tensor().payload(), "xyz");
  for (size_t piece : {size_t{1}, size_t{2}, size_t{0}}) {
    absl::StatusOr<v1::TensorBundle> got = Parse(bytes, piece);
    ASSERT_THAT(got, IsOk());
    EXPECT_TRUE(MessageDifferencer::Equals(*got, want)) << got->DebugString();
  }
}

TEST(BundleStream, EveryTruncationIsRefusedOrReadAsProtobufReadsIt) {
  const std::string bytes = Sample(7).SerializeAsString();
  ASSERT_GT(bytes.size(), 100u);
  for (size_t cut = 0; cut < bytes.size(); cut += 1 + cut / 50) {
    const std::string prefix = bytes.substr(0, cut);
    // Announced whole, fed short: never a bundle.
    BundleStreamParser short_fed(bytes.size());
    ASSERT_THAT(short_fed.Feed(prefix), IsOk());
    EXPECT_THAT(short_fed.Finish(), StatusIs(absl::StatusCode::kInvalidArgument));
    // The prefix as a whole message: what protobuf makes of it, or an error where it fails.
    v1::TensorBundle want;
    const bool ok = want.ParseFromString(prefix);
    absl::StatusOr<v1::TensorBundle> got = Parse(prefix, 0);
    EXPECT_EQ(got.ok(), ok) << "cut " << cut;
    if (ok && got.ok()) {
      EXPECT_TRUE(MessageDifferencer::Equals(*got, want)) << "cut " << cut;
    }
  }
}

TEST(BundleStream, CorruptBytesAreNeverReadOtherwiseThanProtobufReadsThem) {
  const std::string bytes = Sample(11).SerializeAsString();
  std::mt19937 rng(3);
  int refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bad = bytes;
    for (int k = 0; k < 1 + trial % 3; ++k) bad[rng() % 64 % bad.size()] = static_cast<char>(rng());
    v1::TensorBundle want;
    const bool ok = want.ParseFromString(bad);
    absl::StatusOr<v1::TensorBundle> got = Parse(bad, 0, bad.size(), trial);
    if (got.ok()) {
      ASSERT_TRUE(ok) << "accepted what protobuf refuses, trial " << trial;
      ASSERT_TRUE(MessageDifferencer::Equals(*got, want)) << "trial " << trial;
    } else {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
}

TEST(BundleStream, LengthsPastTheirMessageAreRefusedBeforeAnyAllocation) {
  // A payload announcing 2 GB inside a 20-byte bundle.
  const std::string bytes = std::string("\x22\x10\x12\x0e\x3a\xff\xff\xff\xff\x07", 10);
  BundleStreamParser p(20);
  EXPECT_THAT(p.Feed(bytes), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("runs past")));
  EXPECT_THAT(p.Feed("x"), StatusIs(absl::StatusCode::kFailedPrecondition));
  // A NamedTensor longer than the bundle.
  EXPECT_THAT(Parse(std::string("\x22\x05\x0a\x01x", 5)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("runs past")));
}

TEST(BundleStream, AFiveByteTagLosesItsBitsPast32AsInProtobuf) {
  const std::string bytes("\xfd\xff\xff\xff\x60\x60\x60\x60\x98", 9);
  v1::TensorBundle want;
  ASSERT_TRUE(want.ParseFromString(bytes));
  absl::StatusOr<v1::TensorBundle> got = Parse(bytes, 1);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->SerializeAsString(), want.SerializeAsString());
}

TEST(BundleStream, MoreBytesThanAnnouncedAreRefused) {
  const std::string bytes = Sample(2).SerializeAsString();
  EXPECT_THAT(Parse(bytes, bytes.size(), bytes.size() - 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more bytes than")));
}

TEST(BundleStream, DuplicatesProtobufWouldMergeAndGroupsAreRefused) {
  // Two payloads in one tensor; two tensors in one NamedTensor; a group at the top.
  EXPECT_THAT(Parse(std::string("\x22\x08\x12\x06\x3a\x01\x61\x3a\x01\x62", 10)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("two payloads")));
  EXPECT_THAT(Parse(std::string("\x22\x04\x12\x00\x12\x00", 6)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("two tensors")));
  EXPECT_THAT(Parse(std::string("\x2b\x2c", 2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("groups")));
}

TEST(BundleStream, APayloadIsReadIntoAStringOfExactlyItsSize) {
  v1::TensorBundle b;
  b.add_tensors()->mutable_tensor()->set_payload(std::string(3 << 20, 'x'));
  absl::StatusOr<v1::TensorBundle> got = Parse(b.SerializeAsString(), 1 << 20);
  ASSERT_THAT(got, IsOk());
  const std::string& payload = got->tensors(0).tensor().payload();
  EXPECT_EQ(payload.size(), size_t{3} << 20);
  EXPECT_LT(payload.capacity(), (size_t{3} << 20) + 64);  // reserved once, never grown
}

// Sees nothing, and asks for every payload of a codec named "none.v1" to stay in place.
class InPlaceNone final : public PayloadObserver {
 public:
  void Begin(size_t index, absl::string_view fields, uint64_t) override {
    v1::EncodedTensor header;
    ASSERT_TRUE(header.ParseFromArray(fields.data(), static_cast<int>(fields.size())));
    if (in_place_.size() <= index) in_place_.resize(index + 1);
    in_place_[index] = header.codec() == "none.v1";
  }
  void Bytes(size_t, absl::string_view) override {}
  bool InPlace(size_t index) const override { return index < in_place_.size() && in_place_[index]; }

 private:
  std::vector<bool> in_place_;
};

// Feeds `bytes` in pieces of random sizes, each with an owner (the count of owners made goes to
// `owners`, the last one's use count after Finish to `held`) unless `owned` is false.
absl::StatusOr<ReceivedBundle> ParseInPlace(const std::string& bytes, uint64_t min_bytes,
                                            bool owned = true, uint32_t seed = 1) {
  InPlaceNone observer;
  BundleStreamParser p(bytes.size(), &observer, min_bytes);
  std::mt19937 rng(seed);
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = std::min<size_t>(bytes.size() - at, 1 + rng() % 700);
    std::shared_ptr<const void> owner = owned ? std::make_shared<int>(0) : nullptr;
    if (absl::Status s = p.Feed(absl::string_view(bytes).substr(at, n), owner); !s.ok()) return s;
    at += n;
  }
  return p.FinishInPlace();
}

// `got` with its in-place payloads copied into the bundle.
v1::TensorBundle Joined(ReceivedBundle got) {
  for (size_t i = 0; i < got.in_place.size(); ++i) {
    if (got.in_place[i].empty()) continue;
    EXPECT_TRUE(got.bundle.tensors(static_cast<int>(i)).tensor().payload().empty());
    got.bundle.mutable_tensors(static_cast<int>(i))
        ->mutable_tensor()
        ->set_payload(got.in_place[i].Flatten());
  }
  return std::move(got.bundle);
}

TEST(BundleStream, LargePayloadsWhoseReaderTakesPiecesStayWhereTheyWereFed) {
  v1::TensorBundle b;
  b.set_run_id("r");
  for (const char* codec : {"none.v1", "stc.v1", "none.v1"}) {
    v1::EncodedTensor* t = b.add_tensors()->mutable_tensor();
    t->set_codec(codec);
    std::string payload(5000, '\0');
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7 + 3);
    t->set_payload(payload);
  }
  b.mutable_tensors(2)->mutable_tensor()->mutable_payload()->resize(100);  // under the minimum
  const std::string bytes = b.SerializeAsString();
  absl::StatusOr<ReceivedBundle> got = ParseInPlace(bytes, /*min_bytes=*/1000);
  ASSERT_THAT(got, IsOk());
  ASSERT_EQ(got->in_place.size(), 3u);
  const PayloadPieces& kept = got->in_place[0];
  EXPECT_EQ(kept.size, 5000u);
  EXPECT_GT(kept.pieces.size(), 1u);
  EXPECT_EQ(kept.owners.size(), kept.pieces.size());  // one owner a piece, each held
  for (absl::string_view piece : kept.pieces) {       // views into the fed bytes: nothing copied
    EXPECT_GE(piece.data(), bytes.data());
    EXPECT_LE(piece.data() + piece.size(), bytes.data() + bytes.size());
  }
  for (const auto& owner : kept.owners) EXPECT_GE(owner.use_count(), 1);
  EXPECT_TRUE(got->in_place[1].empty());  // its reader wants it in one place
  EXPECT_TRUE(got->in_place[2].empty());  // too small to be worth holding a slice for
  EXPECT_TRUE(MessageDifferencer::Equals(Joined(*std::move(got)), b));
}

TEST(BundleStream, WithoutOwnersOrAnObserverEveryPayloadIsCopied) {
  v1::TensorBundle b;
  v1::EncodedTensor* t = b.add_tensors()->mutable_tensor();
  t->set_codec("none.v1");
  t->set_payload(std::string(5000, 'x'));
  const std::string bytes = b.SerializeAsString();
  absl::StatusOr<ReceivedBundle> got = ParseInPlace(bytes, 1000, /*owned=*/false);
  ASSERT_THAT(got, IsOk());
  EXPECT_TRUE(got->in_place[0].empty());
  EXPECT_EQ(got->bundle.tensors(0).tensor().payload(), std::string(5000, 'x'));
  BundleStreamParser no_observer(bytes.size(), nullptr, 1);
  ASSERT_THAT(no_observer.Feed(bytes, std::make_shared<int>(0)), IsOk());
  absl::StatusOr<ReceivedBundle> plain = no_observer.FinishInPlace();
  ASSERT_THAT(plain, IsOk());
  EXPECT_TRUE(plain->in_place[0].empty());
}

TEST(BundleStream, APayloadFedPartlyWithoutOwnersIsCopiedWhole) {
  v1::TensorBundle b;
  v1::EncodedTensor* t = b.add_tensors()->mutable_tensor();
  t->set_codec("none.v1");
  std::string payload(5000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i);
  t->set_payload(payload);
  const std::string bytes = b.SerializeAsString();
  InPlaceNone observer;
  BundleStreamParser p(bytes.size(), &observer, 1000);
  ASSERT_THAT(p.Feed(absl::string_view(bytes).substr(0, 2000), std::make_shared<int>(0)), IsOk());
  ASSERT_THAT(p.Feed(absl::string_view(bytes).substr(2000)), IsOk());
  absl::StatusOr<ReceivedBundle> got = p.FinishInPlace();
  ASSERT_THAT(got, IsOk());
  EXPECT_TRUE(got->in_place[0].empty());
  EXPECT_EQ(got->bundle.tensors(0).tensor().payload(), payload);
}

TEST(BundleStream, InPlaceParsesReadWhatProtobufWritesAndFinishJoinsThem) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    const v1::TensorBundle b = Sample(seed);
    const std::string bytes = b.SerializeAsString();
    absl::StatusOr<ReceivedBundle> got = ParseInPlace(bytes, /*min_bytes=*/1, true, seed);
    ASSERT_THAT(got, IsOk()) << seed;
    EXPECT_TRUE(MessageDifferencer::Equals(Joined(*std::move(got)), b)) << seed;
    // Finish gives the same bundle with every payload in it.
    InPlaceNone observer;
    BundleStreamParser p(bytes.size(), &observer, 1);
    ASSERT_THAT(p.Feed(bytes, std::make_shared<int>(0)), IsOk());
    absl::StatusOr<v1::TensorBundle> finished = p.Finish();
    ASSERT_THAT(finished, IsOk());
    EXPECT_TRUE(MessageDifferencer::Equals(*finished, b)) << seed;
  }
}

}  // namespace
}  // namespace tern
