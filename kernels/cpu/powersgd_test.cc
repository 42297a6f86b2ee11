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
  EXPECT_EQ(enc.payload.size(), 4 + 12 + 4 * (rows + cols) * rank);
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

// A rank-0 block carries its values raw (what a bias or a thin matrix is sent as).
TEST(PowerSgd, RankZeroBlockCarriesItsValuesRaw) {
  auto registry = NewBuiltinCodecRegistry();
  auto decoder = registry->DecoderFor("powersgd.v2");
  ASSERT_THAT(decoder, IsOk());
  const uint32_t header[4] = {1, 1, 5, 0};
  const float values[5] = {1, -2, 3, -4, 5};
  std::vector<uint8_t> payload(16 + 20);
  std::memcpy(payload.data(), header, 16);
  std::memcpy(payload.data() + 16, values, 20);
  EncodedView v{"powersgd.v2", 5, {}, payload, {}};
  std::vector<float> y(5, 7.0f);
  ASSERT_THAT((*decoder)->Decode(v, absl::MakeSpan(y)), IsOk());
  EXPECT_EQ(y, std::vector<float>(values, values + 5));
}

// Issue 16's check: a 1024 x 1024 tensor at rank 4 costs 2 x 1024 x 4 floats (plus 16 bytes).
TEST(PowerSgd, A1024By1024TensorAtRank4IsSentAsTwoRank4Factors) {
  const size_t n = 1024;
  const auto m = testing::Gaussian(n * n, 120);
  auto codec = NewBuiltinCodecRegistry()->Create("powersgd:rank=4");
  ASSERT_THAT(codec, IsOk());
  const int64_t shape[2] = {n, n};
  EncodeOptions o;
  o.shape = shape;
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(m, o, &enc), IsOk());
  EXPECT_EQ(enc.payload.size(), 4 + 12 + 4 * (2 * n * 4));
  EXPECT_LT(enc.payload.size(), 4 * n * n / 120);
}

// A whole model in one vector: each weight is factored on its own matrix view, a bias goes raw
// (exactly), and each block keeps its own warm start, so repeated calls approach the top
// singular subspace tensor by tensor.
TEST(PowerSgd, BlocksAreFactoredTensorByTensorWithTheirOwnWarmStart) {
  // w1: 64 x 48 of rank ~4 plus noise; b1: 64 values; w2: 10 x 64.
  const size_t r1 = 64, c1 = 48;
  const auto a = testing::Gaussian(r1 * 4, 121), b = testing::Gaussian(c1 * 4, 122);
  const auto noise = testing::Gaussian(r1 * c1 + 64 + 640, 123);
  std::vector<float> x(r1 * c1 + 64 + 640);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.05f * noise[i];
  for (size_t i = 0; i < r1; ++i)
    for (size_t j = 0; j < c1; ++j)
      for (size_t c = 0; c < 4; ++c) x[i * c1 + j] += a[i * 4 + c] * b[j * 4 + c] / (1.0f + c);
  const TensorBlock blocks[3] = {{r1 * c1, r1}, {64, 64}, {640, 10}};
  auto codec = NewBuiltinCodecRegistry()->Create("powersgd:rank=4");
  ASSERT_THAT(codec, IsOk());
  EncodeOptions o;
  o.blocks = blocks;
  std::vector<float> y(x.size());
  double first = 0, last = 0;
  for (int call = 0; call < 4; ++call) {
    EncodedTensor enc;
    ASSERT_THAT((*codec)->Encode(x, o, &enc), IsOk());
    // Table, w1's factors, b1 raw, w2's factors (640 >= 2 * 74 * 4).
    EXPECT_EQ(enc.payload.size(), 4 + 3 * 12 + 4 * ((r1 + c1) * 4 + 64 + (10 + 64) * 4));
    ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
    for (size_t i = r1 * c1; i < r1 * c1 + 64; ++i) ASSERT_EQ(y[i], x[i]);
    double err = 0;
    for (size_t i = 0; i < r1 * c1; ++i) err += (y[i] - x[i]) * (y[i] - x[i]);
    (call == 0 ? first : last) = err;
  }
  EXPECT_LT(last, 0.5 * first);  // the warm start converged towards the top subspace
}

TEST(PowerSgd, BlocksThatDoNotTileTheInputAreRefused) {
  auto codec = NewBuiltinCodecRegistry()->Create("powersgd:rank=4");
  ASSERT_THAT(codec, IsOk());
  const std::vector<float> x(100, 1.0f);
  const TensorBlock short_blocks[1] = {{90, 10}}, bad_rows[1] = {{100, 7}};
  EncodedTensor enc;
  EncodeOptions o;
  o.blocks = short_blocks;
  EXPECT_FALSE((*codec)->Encode(x, o, &enc).ok());
  o.blocks = bad_rows;
  EXPECT_FALSE((*codec)->Encode(x, o, &enc).ok());
}

}  // namespace
}  // namespace tern
