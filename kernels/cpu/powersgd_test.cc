#include "kernels/cpu/powersgd.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/error_feedback.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;

TEST(PowerSgd, RecoversALowRankMatrixExactly) {
  const size_t rows = 60, cols = 40, rank = 3;
  const auto a = testing::Gaussian(rows * rank, 111), b = testing::Gaussian(cols * rank, 112);
  std::vector<float> m(rows * cols, 0.0f);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j)
      for (size_t c = 0; c < rank; ++c) m[i * cols + j] += a[i * rank + c] * b[j * rank + c];
  auto codec = NewBuiltinCodecRegistry()->Create("powersgd:rank=3");
  ASSERT_THAT(codec, IsOk());
  const int64_t shape[2] = {rows, cols};
  EncodeOptions o;
  o.shape = shape;
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(m, o, &enc), IsOk());
  EXPECT_EQ(enc.payload.size(), 12 + 4 * (rows + cols) * rank);
  std::vector<float> y(m.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  double err = 0, norm = 0;
  for (size_t i = 0; i < m.size(); ++i) err += (y[i] - m[i]) * (y[i] - m[i]), norm += m[i] * m[i];
  EXPECT_LT(std::sqrt(err / norm), 1e-4);
}

TEST(PowerSgd, OrthogonalizeGivesOrthonormalColumns) {
  const size_t rows = 100, r = 4;
  auto p = testing::Gaussian(rows * r, 113);
  powersgd::Orthogonalize(absl::MakeSpan(p), rows, r);
  for (size_t a = 0; a < r; ++a) {
    for (size_t b = 0; b < r; ++b) {
      double dot = 0;
      for (size_t i = 0; i < rows; ++i) dot += double(p[i * r + a]) * p[i * r + b];
      EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-5);
    }
  }
}

TEST(PowerSgd, WithErrorFeedbackTheSentSumConvergesToTheInputSum) {
  // A full-rank matrix sent repeatedly at rank 2: the residual stays bounded, so the average of
  // what was sent approaches the input.
  const size_t rows = 32, cols = 32;
  const auto g = testing::Gaussian(rows * cols, 114);
  auto codec = NewBuiltinCodecRegistry()->Create("powersgd:rank=2");
  ASSERT_THAT(codec, IsOk());
  ErrorFeedback ef(std::move(*codec));
  const int64_t shape[2] = {rows, cols};
  EncodeOptions o;
  o.shape = shape;
  std::vector<double> sent(g.size(), 0.0);
  std::vector<float> y(g.size());
  const int steps = 200;
  for (int t = 0; t < steps; ++t) {
    EncodedTensor enc;
    ASSERT_THAT(ef.Encode(g, o, &enc), IsOk());
    ASSERT_THAT(ef.codec().Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
    for (size_t i = 0; i < g.size(); ++i) sent[i] += y[i];
  }
  double err = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    err += (sent[i] / steps - g[i]) * (sent[i] / steps - g[i]);
    norm += double(g[i]) * g[i];
  }
  EXPECT_LT(std::sqrt(err / norm), 0.1);
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// Found by fuzz_decode_powersgd: a rank-0 payload (empty factors) must decode to zeros.
TEST(PowerSgd, RankZeroPayloadDecodesToZeros) {
  auto registry = NewBuiltinCodecRegistry();
  auto decoder = registry->DecoderFor("powersgd.v1");
  ASSERT_THAT(decoder, IsOk());
  const uint32_t header[3] = {1, 5, 0};
  std::vector<uint8_t> payload(12);
  std::memcpy(payload.data(), header, 12);
  EncodedView v{"powersgd.v1", 5, {}, payload};
  std::vector<float> y(5, 7.0f);
  ASSERT_THAT((*decoder)->Decode(v, absl::MakeSpan(y)), IsOk());
  EXPECT_EQ(y, std::vector<float>(5, 0.0f));
}

}  // namespace
}  // namespace tern
