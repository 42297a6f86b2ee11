// Properties every codec must have, run over every built-in codec: round trip within the codec's
// error, decode-and-accumulate consistency, determinism across thread counts, and rejection of
// truncated, oversize, corrupted and wrong-codec payloads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/rng.h"
#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/select.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

struct Case {
  std::string spec;
  double max_rel_error;  // ||D(C(x)) - x|| / ||x|| on N(0,1) data of 10007 elements
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.spec; }

std::vector<Case> AllCases() {
  return {
      {"none", 0.0},
      {"fp16", 1e-3},
      {"bf16", 5e-3},
      {"int8", 2e-2},
      {"int8:mode=minmax,round=stochastic,block=100", 3e-2},
      {"fp4", 0.3},
      {"fp4:element=e2m1,round=stochastic,block=33", 0.3},
      {"topk:ratio=0.1", 0.9},
      {"chunk-topk:chunk=100,ratio=0.1", 0.9},
      {"chunk-topk:chunk=33,k=5,bits=1", 0.9},
      {"dgc:ratio=0.1", 0.9},
      // Biased random-k keeps 10 % unchanged: sqrt(1 - 0.1) = 0.949 expected.
      {"randomk:ratio=0.1", 0.96},
      // Unbiased random-k scales by d / k = 2: sqrt(d / k - 1) = 1 expected.
      {"randomk:ratio=0.5,unbiased=1", 1.05},
      {"threshold:tau=1.0", 0.9},
      {"dct:ratio=0.1,every=3", 0.9},
      // Half the smallest magnitudes of N(0,1) hold 7 % of its energy: 0.27, plus the grids'.
      {"hq:ratio=0.5,bits=6-4-3-2", 0.35},
      {"hq:ratio=1,bits=8", 0.05},
      {"terngrad", 2.0},
      {"terngrad:pack=base3,clip=0", 2.5},
      {"qsgd:levels=16", 3.0},
      {"qsgd:levels=1024", 0.2},
      {"sign", 0.7},
      {"sign:chunk=8", 0.7},
      {"natural", 0.5},
      {"natural-dither:levels=8", 0.45},   // measured 0.36
      {"natural-dither:levels=30", 0.35},  // measured 0.29
      {"stc:ratio=0.1", 0.8},              // measured 0.76: top 10 % by their mean magnitude
      // A [d] tensor and the [d/7, 7] views here are too thin to gain 2x from rank-4 factors, so
      // they go raw, exactly (powersgd_test.cc covers the factored blocks).
      {"powersgd:rank=4", 1e-6},
  };
}

class AllCodecs : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    registry_ = NewBuiltinCodecRegistry();
    auto codec = registry_->Create(GetParam().spec);
    ASSERT_THAT(codec, IsOk());
    codec_ = std::move(*codec);
  }
  EncodedTensor Encode(const std::vector<float>& x, uint64_t seed = 1, ThreadPool* pool = nullptr) {
    EncodedTensor enc;
    EncodeOptions o;
    o.seed = seed;
    o.pool = pool;
    const int64_t shape[2] = {static_cast<int64_t>(x.size() / 7), 7};
    if (x.size() % 7 == 0 && !x.empty()) o.shape = shape;
    EXPECT_THAT(codec_->Encode(x, o, &enc), IsOk());
    return enc;
  }
  std::unique_ptr<CodecRegistry> registry_;
  std::unique_ptr<Codec> codec_;
};

double RelError(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

TEST_P(AllCodecs, RoundTripIsWithinTheCodecsError) {
  const auto x = testing::Gaussian(10007, 5);
  const EncodedTensor enc = Encode(x);
  EXPECT_EQ(enc.codec, codec_->Name());
  EXPECT_EQ(enc.numel, x.size());
  std::vector<float> y(x.size(), 123.0f);
  ASSERT_THAT(codec_->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  EXPECT_LE(RelError(y, x), GetParam().max_rel_error);
  if (codec_->lossless()) {
    EXPECT_EQ(y, x);
  }
  // The registry's decoder (built from the payload alone) agrees with the encoder's instance.
  std::vector<float> z(x.size());
  ASSERT_THAT(registry_->Decode(EncodedView::Of(enc), absl::MakeSpan(z)), IsOk());
  EXPECT_EQ(y, z);
}

TEST_P(AllCodecs, OddAndTinySizesRoundTrip) {
  for (size_t n : {0u, 1u, 2u, 7u, 9u, 63u, 4097u}) {
    const auto x = testing::Gaussian(n, 50 + n);
    const EncodedTensor enc = Encode(x);
    std::vector<float> y(n);
    ASSERT_THAT(codec_->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk()) << n;
    for (float v : y) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST_P(AllCodecs, DecodeAccumulateAddsTheWeightedDecode) {
  const auto x = testing::Gaussian(5005, 6);
  const auto prior = testing::Gaussian(5005, 7);
  const EncodedTensor enc = Encode(x);
  std::vector<float> decoded(x.size());
  ASSERT_THAT(codec_->Decode(EncodedView::Of(enc), absl::MakeSpan(decoded)), IsOk());
  std::vector<float> acc = prior;
  ASSERT_THAT(codec_->DecodeAccumulate(EncodedView::Of(enc), -0.375f, absl::MakeSpan(acc)), IsOk());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(acc[i], prior[i] - 0.375f * decoded[i], 1e-5f * (1 + std::fabs(decoded[i]))) << i;
  }
}

TEST_P(AllCodecs, DecodeAccumulateEachIsDecodeAccumulateIntoEveryTargetBitForBit) {
  const auto x = testing::Gaussian(5005, 16);
  const EncodedTensor enc = Encode(x);
  const EncodedView in = EncodedView::Of(enc);
  const float weights[3] = {1.0f, -0.375f, 0.1f};
  std::vector<std::vector<float>> each, one_by_one;
  for (int t = 0; t < 3; ++t) each.push_back(testing::Gaussian(x.size(), 17 + t));
  one_by_one = each;
  std::vector<WeightedTarget> targets;
  for (int t = 0; t < 3; ++t) {
    targets.push_back({weights[t], absl::MakeSpan(each[t])});
    ASSERT_THAT(codec_->DecodeAccumulate(in, weights[t], absl::MakeSpan(one_by_one[t])), IsOk());
  }
  ASSERT_THAT(codec_->DecodeAccumulateEach(in, targets), IsOk());
  EXPECT_EQ(each, one_by_one);
  ASSERT_THAT(registry_->DecodeAccumulateEach(in, {}), IsOk());
  // A bad payload or a target of another size touches none of them.
  EncodedView truncated = in;
  truncated.payload = truncated.payload.subspan(0, truncated.payload.size() - 1);
  EXPECT_THAT(registry_->DecodeAccumulateEach(truncated, targets),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<float> short_target(x.size() - 1);
  targets.push_back({1.0f, absl::MakeSpan(short_target)});
  EXPECT_THAT(codec_->DecodeAccumulateEach(in, targets),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(each, one_by_one);
}

TEST_P(AllCodecs, DecodeAccumulateManyIsEachPayloadAccumulatedInTurnBitForBit) {
  // Larger than the sign codec's block of 8,192 values, so blocks and tails both run.
  const size_t n = 20011;
  std::vector<EncodedTensor> encoded;
  for (int j = 0; j < 3; ++j) encoded.push_back(Encode(testing::Gaussian(n, 30 + j), 40 + j));
  std::vector<EncodedView> views;
  for (const EncodedTensor& e : encoded) views.push_back(EncodedView::Of(e));
  const float weights[3] = {0.25f, -0.375f, 1.0f};
  std::vector<float> many = testing::Gaussian(n, 33), in_turn = many;
  for (int j = 0; j < 3; ++j) {
    ASSERT_THAT(codec_->DecodeAccumulate(views[j], weights[j], absl::MakeSpan(in_turn)), IsOk());
  }
  ASSERT_THAT(registry_->DecodeAccumulateMany(views, weights, absl::MakeSpan(many)), IsOk());
  EXPECT_EQ(0, std::memcmp(many.data(), in_turn.data(), 4 * n));
  // A truncated payload, a weight short or a payload of another size: an error.
  EncodedView truncated = views[1];
  truncated.payload = truncated.payload.subspan(0, truncated.payload.size() - 1);
  const EncodedView with_truncated[3] = {views[0], truncated, views[2]};
  EXPECT_THAT(registry_->DecodeAccumulateMany(with_truncated, weights, absl::MakeSpan(many)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      codec_->DecodeAccumulateMany(views, absl::MakeConstSpan(weights, 2), absl::MakeSpan(many)),
      StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<float> short_out(n - 1);
  EXPECT_THAT(codec_->DecodeAccumulateMany(views, weights, absl::MakeSpan(short_out)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(AllCodecs, PayloadIsIdenticalWithAThreadPoolAndReproducibleFromTheSeed) {
  const auto x = testing::Gaussian(300007, 8);
  ThreadPool pool(3);
  const EncodedTensor a = Encode(x, 99), b = Encode(x, 99, &pool);
  EXPECT_EQ(a.payload, b.payload);
  EXPECT_EQ(a.scales, b.scales);
  auto fresh = registry_->Create(GetParam().spec);
  ASSERT_THAT(fresh, IsOk());
  codec_ = std::move(*fresh);
  EXPECT_EQ(Encode(x, 99).payload, a.payload);
}

// A codec that says it encodes from the top-k (TopK > 0) writes the same bytes from SelectTopK's
// selection as from the input, and refuses a selection of another size or order; the others
// refuse to encode from one.
TEST_P(AllCodecs, EncodingATopKSelectionIsEncodingTheInput) {
  const auto x = testing::Gaussian(20011, 12);
  const size_t k = codec_->TopK(x.size());
  std::vector<uint32_t> idx;
  std::vector<float> values;
  SelectTopK(x, std::max<size_t>(k, 1), &idx, nullptr, &values);
  EncodedTensor from_selection;
  const absl::Status s =
      codec_->EncodeSelection({x.size(), idx, values}, EncodeOptions{}, &from_selection);
  if (k == 0) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnimplemented));
    return;
  }
  ASSERT_THAT(s, IsOk());
  const EncodedTensor whole = Encode(x, 5);
  EXPECT_EQ(from_selection.codec, whole.codec);
  EXPECT_EQ(from_selection.params, whole.params);
  EXPECT_EQ(from_selection.numel, whole.numel);
  EXPECT_EQ(from_selection.scales, whole.scales);
  EXPECT_EQ(from_selection.payload, whole.payload);
  EncodedTensor bad;
  EXPECT_THAT(codec_->EncodeSelection({x.size(), absl::MakeConstSpan(idx).subspan(1),
                                       absl::MakeConstSpan(values).subspan(1)},
                                      EncodeOptions{}, &bad),
              StatusIs(absl::StatusCode::kInvalidArgument));
  if (k > 1) {
    std::swap(idx[0], idx[1]);
    EXPECT_THAT(codec_->EncodeSelection({x.size(), idx, values}, EncodeOptions{}, &bad),
                StatusIs(absl::StatusCode::kInvalidArgument));
    std::swap(idx[0], idx[1]);
  }
  idx.back() = static_cast<uint32_t>(x.size());
  EXPECT_THAT(codec_->EncodeSelection({x.size(), idx, values}, EncodeOptions{}, &bad),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(AllCodecs, RejectsAPayloadOfAnotherCodecOrSize) {
  const auto x = testing::Gaussian(1001, 9);
  EncodedTensor enc = Encode(x);
  std::vector<float> y(x.size());
  EncodedView v = EncodedView::Of(enc);
  v.codec = "bogus.v1";
  EXPECT_THAT(codec_->Decode(v, absl::MakeSpan(y)), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(registry_->Decode(v, absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::string other_version(codec_->Name());
  other_version.back() = '9';
  v.codec = other_version;
  EXPECT_THAT(registry_->Decode(v, absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<float> small(x.size() - 1);
  EXPECT_THAT(codec_->Decode(EncodedView::Of(enc), absl::MakeSpan(small)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(AllCodecs, RejectsEveryTruncation) {
  const auto x = testing::Gaussian(777, 10);
  const EncodedTensor enc = Encode(x);
  std::vector<float> y(x.size());
  const size_t n = enc.payload.size();
  for (size_t len = 0; len < n; len += std::max<size_t>(1, n / 300)) {
    EncodedView v = EncodedView::Of(enc);
    v.payload = v.payload.subspan(0, len);
    ASSERT_THAT(codec_->Decode(v, absl::MakeSpan(y)), StatusIs(absl::StatusCode::kInvalidArgument))
        << "prefix of " << len << " / " << n << " bytes";
  }
  EncodedView v = EncodedView::Of(enc);
  v.payload = v.payload.subspan(0, n - 1);
  EXPECT_THAT(codec_->Decode(v, absl::MakeSpan(y)), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(AllCodecs, RejectsOversizePayloadAndWrongScaleCount) {
  const auto x = testing::Gaussian(777, 11);
  EncodedTensor enc = Encode(x);
  std::vector<float> y(x.size());
  EncodedTensor longer = enc;
  longer.payload.append(9, '\0');
  EXPECT_THAT(codec_->Decode(EncodedView::Of(longer), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EncodedTensor more_scales = enc;
  more_scales.scales.push_back(1.0f);
  EXPECT_THAT(codec_->Decode(EncodedView::Of(more_scales), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  if (!enc.scales.empty()) {
    EncodedTensor nan_scale = enc;
    nan_scale.scales[0] = std::nanf("");
    EXPECT_THAT(codec_->Decode(EncodedView::Of(nan_scale), absl::MakeSpan(y)),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST_P(AllCodecs, RandomCorruptionIsAnErrorOrAFiniteDecodeNeverACrash) {
  const auto x = testing::Gaussian(513, 12);
  const EncodedTensor enc = Encode(x);
  const RngKey key = MakeRngKey(13);
  std::vector<float> y(x.size());
  int rejected = 0;
  for (uint32_t trial = 0; trial < 1500; ++trial) {
    EncodedTensor bad = enc;
    const int flips = 1 + Random32(key, 3 * trial) % 4;
    for (int f = 0; f < flips && !bad.payload.empty(); ++f) {
      const uint32_t r = Random32(key, 3 * trial + 1 + f * 7919);
      bad.payload[r % bad.payload.size()] ^= static_cast<char>(1 + (r >> 24) % 255);
    }
    absl::Status s = codec_->Decode(EncodedView::Of(bad), absl::MakeSpan(y));
    if (!s.ok()) {
      ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      ++rejected;
      continue;
    }
    // Accepted: then every value is finite, so no corrupted message can poison a model.
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << "trial " << trial << " element " << i << ": " << y[i];
    }
  }
  RecordProperty("rejected", rejected);
}

// A well-formed message may still carry a harmful value: NaN or Inf written over any 4 bytes of
// the payload (a value field, whatever the layout) is refused by Validate and Decode, or decodes
// to finite values. One such gossip message used to turn every model of a run into NaN.
TEST_P(AllCodecs, NonFiniteWordsAnywhereInThePayloadAreRefusedOrDecodeFinite) {
  const auto x = testing::Gaussian(203, 16);
  const EncodedTensor enc = Encode(x);
  std::vector<float> y(x.size());
  for (const uint32_t word : {0x7fc00000u, 0x7f800000u, 0xff800000u}) {
    for (size_t at = 0; at + 4 <= enc.payload.size(); ++at) {
      EncodedTensor bad = enc;
      std::memcpy(bad.payload.data() + at, &word, 4);
      const absl::Status v = codec_->Validate(EncodedView::Of(bad));
      const absl::Status d = codec_->Decode(EncodedView::Of(bad), absl::MakeSpan(y));
      ASSERT_EQ(v.ok(), d.ok()) << "word " << word << " at " << at << ": " << v << " / " << d;
      if (!d.ok()) continue;
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i]))
            << "word " << std::hex << word << std::dec << " at byte " << at << " element " << i;
      }
    }
  }
}

// The norm a receiver's guard measures is the decoded tensor's, with Validate's verdict.
TEST_P(AllCodecs, NormIsTheDecodedTensorsNormWithValidatesVerdict) {
  const auto x = testing::Gaussian(2101, 17);
  const EncodedTensor enc = Encode(x);
  std::vector<float> y(x.size());
  ASSERT_THAT(codec_->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  absl::StatusOr<double> norm = registry_->Norm(EncodedView::Of(enc));
  ASSERT_THAT(norm, IsOk());
  EXPECT_NEAR(*norm, L2Norm(y), 1e-5 * L2Norm(y));
  // A payload checked already (a receiver's clipping, after the arrival check) has the same norm.
  EncodedView checked = EncodedView::Of(enc);
  checked.checked = true;
  absl::StatusOr<double> checked_norm = registry_->Norm(checked);
  ASSERT_THAT(checked_norm, IsOk());
  EXPECT_EQ(*checked_norm, *norm);
  EncodedTensor cut = enc;
  cut.payload.resize(cut.payload.size() / 2);
  EXPECT_THAT(codec_->Norm(EncodedView::Of(cut)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// What a receiver checks on arrival must be exactly what decoding would refuse: a message it
// accepts always decodes, and one it refuses would not have.
TEST_P(AllCodecs, ValidateGivesDecodesVerdictOnGoodTruncatedAndCorruptPayloads) {
  const auto x = testing::Gaussian(513, 14);
  const EncodedTensor enc = Encode(x);
  std::vector<float> y(x.size());
  EXPECT_THAT(codec_->Validate(EncodedView::Of(enc)), IsOk());
  EXPECT_THAT(registry_->Validate(EncodedView::Of(enc)), IsOk());
  auto same_verdict = [&](const EncodedView& v, const std::string& what) {
    const absl::Status d = codec_->Decode(v, absl::MakeSpan(y));
    const absl::Status c = codec_->Validate(v);
    ASSERT_EQ(d.ok(), c.ok()) << what << ": decode " << d << ", validate " << c;
    if (!c.ok()) {
      ASSERT_EQ(c.code(), absl::StatusCode::kInvalidArgument) << what;
    }
  };
  const size_t n = enc.payload.size();
  for (size_t len = 0; len < n; len += std::max<size_t>(1, n / 100)) {
    EncodedView v = EncodedView::Of(enc);
    v.payload = v.payload.subspan(0, len);
    same_verdict(v, "prefix of " + std::to_string(len));
  }
  EncodedTensor longer = enc;
  longer.payload.append(9, '\0');
  same_verdict(EncodedView::Of(longer), "oversize");
  const RngKey key = MakeRngKey(15);
  for (uint32_t trial = 0; trial < 500; ++trial) {
    EncodedTensor bad = enc;
    const uint32_t r = Random32(key, trial);
    if (!bad.payload.empty()) {
      bad.payload[r % bad.payload.size()] ^= static_cast<char>(1 + (r >> 24) % 255);
    }
    same_verdict(EncodedView::Of(bad), "corruption " + std::to_string(trial));
  }
}

// `payload` cut into pieces of 1 to 999 bytes (words split between pieces).
std::vector<absl::string_view> Pieces(absl::string_view payload, uint64_t seed) {
  std::vector<absl::string_view> pieces;
  const RngKey key = MakeRngKey(seed);
  for (size_t at = 0, i = 0; at < payload.size(); ++i) {
    const size_t n = std::min<size_t>(payload.size() - at, 1 + Random32(key, i) % 999);
    pieces.push_back(payload.substr(at, n));
    at += n;
  }
  return pieces;
}

// A payload received in place (EncodedView::pieces) reads exactly as the same bytes in one
// buffer: cast codecs read the pieces, the others get them joined.
TEST_P(AllCodecs, APayloadInPiecesReadsExactlyAsInOnePlace) {
  const auto x = testing::Gaussian(20011, 18);
  const EncodedTensor enc = Encode(x);
  const EncodedView flat = EncodedView::Of(enc);
  const std::vector<absl::string_view> pieces = Pieces(enc.payload, 19);
  EncodedView split = flat;
  split.payload = {};
  split.pieces = pieces;
  EXPECT_EQ(split.PayloadSize(), enc.payload.size());
  std::vector<float> want(x.size()), got(x.size(), 5.0f);
  ASSERT_THAT(codec_->Decode(flat, absl::MakeSpan(want)), IsOk());
  ASSERT_THAT(codec_->Decode(split, absl::MakeSpan(got)), IsOk());
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), 4 * x.size()));
  std::vector<float> acc_want = x, acc_got = x;
  ASSERT_THAT(codec_->DecodeAccumulate(flat, 0.25f, absl::MakeSpan(acc_want)), IsOk());
  ASSERT_THAT(codec_->DecodeAccumulate(split, 0.25f, absl::MakeSpan(acc_got)), IsOk());
  EXPECT_EQ(0, std::memcmp(acc_want.data(), acc_got.data(), 4 * x.size()));
  const WeightedTarget targets[1] = {{-0.5f, absl::MakeSpan(acc_got)}};
  const WeightedTarget want_targets[1] = {{-0.5f, absl::MakeSpan(acc_want)}};
  ASSERT_THAT(codec_->DecodeAccumulateEach(flat, want_targets), IsOk());
  ASSERT_THAT(codec_->DecodeAccumulateEach(split, targets), IsOk());
  EXPECT_EQ(0, std::memcmp(acc_want.data(), acc_got.data(), 4 * x.size()));
  EXPECT_THAT(codec_->Validate(split), IsOk());
  absl::StatusOr<double> norm_flat = codec_->Norm(flat), norm_split = codec_->Norm(split);
  ASSERT_THAT(norm_split, IsOk());
  EXPECT_EQ(*norm_flat, *norm_split);  // bit for bit: the same sums in the same order
  // A piece short or a word made NaN where two pieces meet is refused as it would be in one place.
  EncodedView cut = split;
  cut.pieces = absl::MakeConstSpan(pieces).subspan(0, pieces.size() - 1);
  EXPECT_THAT(codec_->Decode(cut, absl::MakeSpan(got)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(codec_->Validate(cut), StatusIs(absl::StatusCode::kInvalidArgument));
  std::string bad = enc.payload;
  const size_t at = pieces[0].size() / 4 * 4;  // the word that the first cut splits, if any
  const uint32_t nan = 0x7fc00000u;
  if (at + 4 <= bad.size()) std::memcpy(bad.data() + at, &nan, 4);
  EncodedView bad_flat = flat;
  bad_flat.payload = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bad.data()), bad.size());
  const std::vector<absl::string_view> bad_pieces = Pieces(bad, 19);
  EncodedView bad_split = split;
  bad_split.pieces = bad_pieces;
  EXPECT_EQ(codec_->Validate(bad_flat).ok(), codec_->Validate(bad_split).ok());
  EXPECT_EQ(codec_->Decode(bad_flat, absl::MakeSpan(want)).ok(),
            codec_->Decode(bad_split, absl::MakeSpan(got)).ok());
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  std::string name;
  for (char c : info.param.spec) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Builtin, AllCodecs, ::testing::ValuesIn(AllCases()), CaseName);

// Decodes of >= 16 MiB of output take the non-temporal-store path (natural, 2-bit terngrad):
// the values must equal those of the accumulate path (plain stores), also when the output starts
// off a 64-byte boundary (a scalar head) and the length is ragged (a scalar tail).
TEST(LargeDecodes, StreamingStoresWriteTheSameValuesAsTheAccumulatePath) {
  auto registry = NewBuiltinCodecRegistry();
  const size_t n = (size_t{16} << 20) / sizeof(float) + 37;
  const auto x = testing::Gaussian(n, 95);
  for (const char* spec : {"natural", "terngrad", "int8"}) {
    auto codec = registry->Create(spec);
    ASSERT_THAT(codec, IsOk());
    EncodedTensor e;
    EncodeOptions o;
    o.seed = 5;
    ASSERT_THAT((*codec)->Encode(x, o, &e), IsOk()) << spec;
    std::vector<float> want(n, 0.0f);
    ASSERT_THAT((*codec)->DecodeAccumulate(EncodedView::Of(e), 1.0f, absl::MakeSpan(want)), IsOk());
    for (size_t shift : {0, 1, 5}) {  // 4 and 20 bytes off the allocation's alignment
      std::vector<float> buf(n + 16, -1.0f);
      ASSERT_THAT((*codec)->Decode(EncodedView::Of(e), absl::MakeSpan(buf.data() + shift, n)),
                  IsOk());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(buf[shift + i], want[i]) << spec << " shift " << shift << " element " << i;
      }
      EXPECT_EQ(buf[shift + n], -1.0f) << spec;  // nothing written past the end
    }
  }
}

TEST(AllCodecsCoverage, EveryRegisteredCodecHasACase) {
  auto registry = NewBuiltinCodecRegistry();
  for (const std::string& name : registry->Names()) {
    bool found = false;
    for (const Case& c : AllCases()) found |= c.spec.substr(0, c.spec.find(':')) == name;
    EXPECT_TRUE(found) << name << " has no property-test case";
  }
}

}  // namespace
}  // namespace tern
