// dct.v1: the threshold from a top-k every `every` encodes, reused in between; its encoder state.
#include "kernels/cpu/dct.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/error_feedback.h"
#include "kernels/format/sparse.h"
#include "kernels/select.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<Codec> Make(const std::string& spec) {
  auto codec = NewBuiltinCodecRegistry()->Create(spec);
  EXPECT_THAT(codec, IsOk());
  return codec.ok() ? std::move(*codec) : nullptr;
}

std::vector<float> Decoded(const Codec& c, const EncodedTensor& e) {
  std::vector<float> y(e.numel);
  EXPECT_THAT(c.Decode(EncodedView::Of(e), absl::MakeSpan(y)), IsOk());
  return y;
}

// The positions a payload sends, as a mask.
std::vector<bool> Sent(const Codec& c, const EncodedTensor& e) {
  const std::vector<float> y = Decoded(c, e);
  std::vector<bool> m(y.size());
  for (size_t i = 0; i < y.size(); ++i) m[i] = y[i] != 0;
  return m;
}

TEST(DctCodec, EveryLthEncodeIsExactTopKAndTheOthersReuseItsKthMagnitude) {
  auto dct = Make("dct:ratio=0.01,every=3");
  auto topk = Make("topk:ratio=0.01");
  ASSERT_NE(dct, nullptr);
  EXPECT_EQ(dct->Spec(), "dct:ratio=0.01,every=3");
  float kth = 0;
  for (int step = 0; step < 7; ++step) {
    const std::vector<float> x = testing::Gaussian(20011, 100 + step, 1.0f + 0.3f * step);
    EncodedTensor d, t;
    ASSERT_THAT(dct->Encode(x, {}, &d), IsOk());
    ASSERT_THAT(topk->Encode(x, {}, &t), IsOk());
    EXPECT_EQ(d.codec, "dct.v1");
    if (step % 3 == 0) {
      // An estimate: the same selection as top-k, byte for byte.
      EXPECT_EQ(d.payload, t.payload) << step;
      kth = INFINITY;
      for (float v : Decoded(*topk, t)) {
        if (v != 0) kth = std::min(kth, std::fabs(v));
      }
    } else {
      // Every element at or above the last estimate's k-th magnitude, and nothing else: the
      // growing scale of x sends more than k.
      const std::vector<bool> sent = Sent(*dct, d);
      size_t n = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(sent[i], std::fabs(x[i]) >= kth) << step << " " << i;
        n += sent[i] ? 1 : 0;
      }
      EXPECT_GT(n, format::SparseK(0.01, x.size())) << step;
    }
  }
}

TEST(DctCodec, ThresholdOfAMostlyZeroTensorSendsNoZeros) {
  auto dct = Make("dct:ratio=0.5,every=4");
  std::vector<float> x(100, 0.0f);
  x[7] = 2;
  x[40] = -3;
  EncodedTensor e;
  ASSERT_THAT(dct->Encode(x, {}, &e), IsOk());  // top-50, zeros among them
  ASSERT_THAT(dct->Encode(x, {}, &e), IsOk());  // the threshold: non-zeros only
  uint32_t k;
  std::memcpy(&k, e.payload.data(), 4);
  EXPECT_EQ(k, 2u);
}

TEST(DctCodec, WithErrorFeedbackWhatWasPutInIsSentOverTheSteps) {
  ErrorFeedback ef(Make("dct:ratio=0.05,every=4"));
  const size_t d = 5003;
  std::vector<double> in(d, 0.0), sent(d, 0.0);
  for (int step = 0; step < 12; ++step) {
    const std::vector<float> g = testing::Gaussian(d, 300 + step);
    EncodedTensor e;
    ASSERT_THAT(ef.Encode(g, {}, &e), IsOk());
    const std::vector<float> y = Decoded(ef.codec(), e);
    for (size_t i = 0; i < d; ++i) {
      in[i] += g[i];
      sent[i] += y[i];
    }
  }
  for (size_t i = 0; i < d; ++i) EXPECT_NEAR(in[i], sent[i] + ef.residual()[i], 1e-4) << i;
}

TEST(DctCodec, ATensorOfAnotherSizeIsEstimatedAfresh) {
  auto dct = Make("dct:ratio=0.01,every=100");
  auto topk = Make("topk:ratio=0.01");
  EncodedTensor d, t;
  ASSERT_THAT(dct->Encode(testing::Gaussian(1000, 1, 100.0f), {}, &d), IsOk());
  const std::vector<float> x = testing::Gaussian(3000, 2);  // its threshold would send nothing
  ASSERT_THAT(dct->Encode(x, {}, &d), IsOk());
  ASSERT_THAT(topk->Encode(x, {}, &t), IsOk());
  EXPECT_EQ(d.payload, t.payload);
}

TEST(DctCodec, ARestoredEncoderStateEncodesAsTheOriginalWould) {
  auto a = Make("dct:ratio=0.02,every=5");
  for (int step = 0; step < 3; ++step) {
    EncodedTensor e;
    ASSERT_THAT(a->Encode(testing::Gaussian(4001, step), {}, &e), IsOk());
  }
  const std::string state = a->SaveEncoderState();
  ASSERT_EQ(state.size(), 17u);
  auto b = Make("dct:ratio=0.02,every=5");
  ASSERT_THAT(b->RestoreEncoderState(state), IsOk());
  auto fresh = Make("dct:ratio=0.02,every=5");
  for (int step = 3; step < 8; ++step) {
    const std::vector<float> x = testing::Gaussian(4001, step, 1.0f + step);
    EncodedTensor ea, eb, ef;
    ASSERT_THAT(a->Encode(x, {}, &ea), IsOk());
    ASSERT_THAT(b->Encode(x, {}, &eb), IsOk());
    ASSERT_THAT(fresh->Encode(x, {}, &ef), IsOk());
    EXPECT_EQ(ea.payload, eb.payload) << step;
    if (step == 4) {
      EXPECT_NE(ea.payload, ef.payload);  // a state of its own, not a fresh one's
    }
  }
  EXPECT_EQ(a->SaveEncoderState(), b->SaveEncoderState());
}

TEST(DctCodec, AnEncoderStateItCouldNotHaveSavedIsRefused) {
  auto a = Make("dct:ratio=0.02,every=5");
  EXPECT_EQ(a->SaveEncoderState(), "");  // nothing estimated yet
  EXPECT_THAT(a->RestoreEncoderState(""), IsOk());
  EncodedTensor e;
  ASSERT_THAT(a->Encode(testing::Gaussian(1000, 3), {}, &e), IsOk());
  const std::string good = a->SaveEncoderState();
  auto b = Make("dct:ratio=0.02,every=5");
  EXPECT_THAT(b->RestoreEncoderState(good.substr(0, 16)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("encoder state")));
  EXPECT_THAT(b->RestoreEncoderState(good + "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  std::string bad = good;
  bad[0] = 2;  // version
  EXPECT_THAT(b->RestoreEncoderState(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = good;
  const uint32_t left = 5;  // not below every
  std::memcpy(bad.data() + 5, &left, 4);
  EXPECT_THAT(b->RestoreEncoderState(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = good;
  const uint32_t nan_key = 0x7fc00000u;
  std::memcpy(bad.data() + 1, &nan_key, 4);
  EXPECT_THAT(b->RestoreEncoderState(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  // A refused state leaves the codec as new: its next encode is an estimate.
  auto topk = Make("topk:ratio=0.02");
  const std::vector<float> x = testing::Gaussian(1000, 4);
  EncodedTensor d, t;
  ASSERT_THAT(b->Encode(x, {}, &d), IsOk());
  ASSERT_THAT(topk->Encode(x, {}, &t), IsOk());
  EXPECT_EQ(d.payload, t.payload);
  // A codec without encoder state takes none.
  EXPECT_THAT(topk->RestoreEncoderState(good),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no encoder state")));
  EXPECT_THAT(NewBuiltinCodecRegistry()->Create("dct:every=0"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
