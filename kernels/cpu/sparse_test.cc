// topk.v1, dgc.v1, threshold.v1: selection properties and index validation.
#include "kernels/format/sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/cpu/topk.h"
#include "kernels/select.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

uint32_t K(const EncodedTensor& e) {
  uint32_t k;
  std::memcpy(&k, e.payload.data(), 4);
  return k;
}

TEST(TopKCodec, KeepsExactlyTheKLargestMagnitudes) {
  auto codec = NewBuiltinCodecRegistry()->Create("topk:ratio=0.013");
  ASSERT_THAT(codec, IsOk());
  const auto x = testing::Gaussian(100003, 41);
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  const size_t k = format::SparseK(0.013, x.size());
  ASSERT_EQ(K(enc), k);
  std::vector<float> y(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  std::vector<float> mags(x.size());
  for (size_t i = 0; i < x.size(); ++i) mags[i] = std::fabs(x[i]);
  std::sort(mags.begin(), mags.end(), std::greater<>());
  const float kth = mags[k - 1];
  size_t kept = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] != 0) {
      ++kept;
      ASSERT_EQ(y[i], x[i]);            // values travel exactly
      ASSERT_GE(std::fabs(x[i]), kth);  // only the largest are kept
    } else {
      ASSERT_LE(std::fabs(x[i]), kth);  // nothing larger is dropped
    }
  }
  EXPECT_EQ(kept, k);
}

TEST(ThresholdCodec, KeepsExactlyTheValuesAtOrAboveTau) {
  auto codec = NewBuiltinCodecRegistry()->Create("threshold:tau=1.5");
  ASSERT_THAT(codec, IsOk());
  auto x = testing::Gaussian(20000, 44);
  x[3] = 1.5f;
  x[4] = -1.5f;
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  std::vector<float> y(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(y[i], std::fabs(x[i]) >= 1.5f ? x[i] : 0.0f) << i;
  }
}

TEST(SparsePayload, RejectsUnsortedDuplicateAndOutOfRangeIndices) {
  auto codec = NewBuiltinCodecRegistry()->Create("topk:ratio=0.5");
  ASSERT_THAT(codec, IsOk());
  const std::vector<float> x = {5, -4, 3, -2, 1, 0.5, 0.25, 0.125};
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  std::vector<float> y(x.size());
  auto set_index = [&](EncodedTensor& e, int j, uint32_t v) {
    std::memcpy(e.payload.data() + 4 + 4 * j, &v, 4);
  };
  EncodedTensor bad = enc;
  set_index(bad, 1, 0);  // [0, 0, ...]: duplicate / not ascending
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not ascending")));
  bad = enc;
  set_index(bad, 3, 8);
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  bad = enc;
  const uint32_t huge = 9;
  std::memcpy(bad.payload.data(), &huge, 4);
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds numel")));
}

}  // namespace
}  // namespace tern
