#include "kernels/payload_scans.h"

#include <random>
#include <string>
#include <vector>

#include "common/chunking.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/wire.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

EncodedTensor Encode(const std::string& spec, const std::vector<float>& x) {
  auto codec = NewBuiltinCodecRegistry()->Create(spec);
  EXPECT_THAT(codec, IsOk());
  EncodedTensor t;
  EXPECT_THAT((*codec)->Encode(x, {}, &t), IsOk());
  return t;
}

// Feeds `payload` to `scan` in pieces that split words (1 to 999 bytes).
void FeedInPieces(PayloadScan& scan, const std::string& payload, uint32_t seed) {
  std::mt19937 rng(seed);
  for (size_t at = 0; at < payload.size();) {
    const size_t n = std::min<size_t>(payload.size() - at, 1 + rng() % 999);
    scan.Feed(absl::string_view(payload).substr(at, n));
    at += n;
  }
}

// The scan of `wire_name`'s payloads, as PayloadScans makes it; null where the codec has none or
// there is no such codec.
std::unique_ptr<PayloadScan> ScanFor(const CodecRegistry& codecs, absl::string_view wire_name) {
  absl::StatusOr<const Codec*> decoder = codecs.DecoderFor(wire_name);
  return decoder.ok() ? (*decoder)->NewPayloadScan() : nullptr;
}

TEST(PayloadScan, CastCodecsScanToTheirNormBitForBitFromPiecesOfAnySize) {
  auto codecs = NewBuiltinCodecRegistry();
  for (const std::string spec : {"none", "fp16", "bf16"}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{1023}, size_t{1024}, size_t{100003}}) {
      const EncodedTensor t = Encode(spec, testing::Gaussian(n, 7, 3.0f));
      std::unique_ptr<PayloadScan> scan = ScanFor(*codecs, t.codec);
      ASSERT_NE(scan, nullptr) << spec;
      FeedInPieces(*scan, t.payload, static_cast<uint32_t>(n));
      absl::StatusOr<double> want = codecs->Norm(EncodedView::Of(t));
      absl::StatusOr<double> got = scan->Finish(EncodedView::Of(t));
      ASSERT_THAT(want, IsOk());
      ASSERT_THAT(got, IsOk());
      EXPECT_EQ(*got, *want) << spec << " n=" << n;  // the same blocks, so the same bits
    }
  }
}

TEST(PayloadScan, BadPayloadsGetNormsVerdict) {
  auto codecs = NewBuiltinCodecRegistry();
  EncodedTensor t = Encode("none", testing::Gaussian(5000, 8));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(t.payload.data() + 4 * 4321, &nan, 4);
  std::unique_ptr<PayloadScan> scan = ScanFor(*codecs, t.codec);
  FeedInPieces(*scan, t.payload, 1);
  EXPECT_THAT(scan->Finish(EncodedView::Of(t)),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("Inf or NaN")));

  EncodedTensor wrong = Encode("fp16", testing::Gaussian(100, 9));
  wrong.numel = 101;  // a payload one word short of its count
  scan = ScanFor(*codecs, wrong.codec);
  FeedInPieces(*scan, wrong.payload, 2);
  EXPECT_THAT(scan->Finish(EncodedView::Of(wrong)), StatusIs(absl::StatusCode::kInvalidArgument));

  scan = ScanFor(*codecs, t.codec);
  scan->Feed(absl::string_view(t.payload).substr(0, 100));  // saw part of it only
  EXPECT_THAT(scan->Finish(EncodedView::Of(t)), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(PayloadScan, CodecsWhoseCheckNeedsTheWholePayloadHaveNone) {
  auto codecs = NewBuiltinCodecRegistry();
  for (const char* name : {"stc.v1", "topk.v1", "int8.v1", "sign.v1", "no-such-codec"}) {
    EXPECT_EQ(ScanFor(*codecs, name), nullptr) << name;
  }
}

TEST(PayloadScans, ABundleArrivingInChunksIsScannedWhereItsCodecsHaveScans) {
  auto codecs = NewBuiltinCodecRegistry();
  const EncodedTensor dense = Encode("none", testing::Gaussian(700000, 10));
  const EncodedTensor sparse = Encode("stc:ratio=0.01", testing::Gaussian(700000, 11));
  v1::TensorBundle bundle;
  ToProto(EncodedTensor(dense), bundle.add_tensors()->mutable_tensor());
  ToProto(EncodedTensor(sparse), bundle.add_tensors()->mutable_tensor());
  ToProto(EncodedTensor(dense), bundle.add_tensors()->mutable_tensor());
  absl::StatusOr<std::vector<v1::BundleChunk>> chunks = ChunkBundle(bundle, 1);
  ASSERT_THAT(chunks, IsOk());
  ASSERT_GT(chunks->size(), 3u);

  PayloadScans scans(codecs.get());
  BundleAssembler assembler(64 << 20, &scans);
  for (const v1::BundleChunk& c : *chunks) ASSERT_THAT(assembler.Add(c), IsOk());
  ASSERT_THAT(assembler.Finish(), IsOk());

  const double norm = *codecs->Norm(EncodedView::Of(dense));
  for (size_t i : {size_t{0}, size_t{2}}) {
    PayloadScan* scan = scans.For(i, dense);
    ASSERT_NE(scan, nullptr) << i;
    EXPECT_EQ(*scan->Finish(EncodedView::Of(dense)), norm);
  }
  EXPECT_EQ(scans.For(1, sparse), nullptr);  // STC: checked after the last byte, as before
  EncodedTensor renamed = dense;
  renamed.codec = "fp16.v1";  // not the codec it was scanned under
  EXPECT_EQ(scans.For(0, renamed), nullptr);
  EXPECT_EQ(scans.For(3, dense), nullptr);
}

}  // namespace
}  // namespace tern
