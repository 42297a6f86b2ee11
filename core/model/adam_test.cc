#include "core/model/adam.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace tern {
namespace {

std::vector<ParamTensor> TwoTensors() {
  return {ParamTensor{std::string("w"), {3}, 0, 3}, ParamTensor{std::string("b"), {2}, 3, 2}};
}

TEST(Adam, FirstStepMovesEachCoordinateByLrAgainstTheGradientSign) {
  // After one step the bias-corrected m / sqrt(v) is g / |g|: every coordinate moves by lr.
  AdamSettings s;
  s.lr = 0.01f;
  s.eps = 0;
  AdamState st;
  const auto layout = TwoTensors();
  st.Reset(5, 2);
  const std::vector<float> x = {1, 2, 3, 4, 5}, g = {0.5f, -2, 1e-3f, -7, 3};
  std::vector<float> step(5);
  AdamStep(s, layout, x, g, &st, absl::MakeSpan(step));
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(step[i], g[i] > 0 ? -0.01f : 0.01f, 1e-7) << i;
  EXPECT_EQ(st.steps, 1);
}

TEST(Adam, MatchesTheTextbookRecurrenceOverManySteps) {
  AdamSettings s;
  s.lr = 0.1f;
  AdamState st;
  const auto layout = TwoTensors();
  st.Reset(5, 2);
  std::vector<float> x(5, 1.0f), step(5);
  double m = 0, v = 0, xr = 1.0;  // coordinate 0 in double
  for (int t = 1; t <= 50; ++t) {
    std::vector<float> g(5);
    for (int i = 0; i < 5; ++i) g[i] = std::sin(0.3f * t + i);
    AdamStep(s, layout, x, g, &st, absl::MakeSpan(step));
    for (int i = 0; i < 5; ++i) x[i] += step[i];
    m = 0.9 * m + 0.1 * g[0];
    v = 0.999 * v + 0.001 * g[0] * g[0];
    xr -= 0.1 * (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8);
  }
  EXPECT_NEAR(x[0], xr, 1e-4);
}

TEST(Lamb, ScalesEachTensorsStepToItsNormAndFreezesTheMeanRatio) {
  AdamSettings s;
  s.lr = 1.0f;
  s.eps = 0;
  s.lamb = true;
  AdamState st;
  const auto layout = TwoTensors();
  st.Reset(5, 2);
  const std::vector<float> x = {3, 0, 4, 0, 0}, g = {1, -1, 1, 1, 1};
  std::vector<float> step(5);
  AdamStep(s, layout, x, g, &st, absl::MakeSpan(step));
  // Tensor "w": ||x|| = 5, ||u|| = sqrt(3): the step's norm is lr * ||x||.
  const double n = std::sqrt(step[0] * step[0] + step[1] * step[1] + step[2] * step[2]);
  EXPECT_NEAR(n, 5.0, 1e-5);
  EXPECT_NEAR(st.ratio[0], 5.0 / std::sqrt(3.0), 1e-5);
  // Tensor "b" is zero: plain Adam (ratio 1).
  EXPECT_NEAR(step[3], -1.0f, 1e-6);
  EXPECT_FLOAT_EQ(st.ratio[1], 1.0f);
}

TEST(FrozenAdam, VarianceIsBiasCorrectedOnceAndTheStepUsesIt) {
  AdamSettings s;
  AdamState st;
  st.Reset(2, 1);
  st.v = {0.001f, 0.004f};  // one step of g = (1, 2) with beta2 = 0.999
  st.steps = 1;
  FreezeVariance(s, &st);
  EXPECT_NEAR(st.v[0], 1.0f, 1e-4);
  EXPECT_NEAR(st.v[1], 4.0f, 1e-3);
  std::vector<float> x = {1, 1};
  const std::vector<float> m = {0.5f, 0.5f};
  FrozenAdamStep(0.1f, 2.0f, 0.0f, m, st.v, absl::MakeSpan(x));
  EXPECT_NEAR(x[0], 1 - 0.1 * 2 * 0.5 / 1.0, 1e-5);
  EXPECT_NEAR(x[1], 1 - 0.1 * 2 * 0.5 / 2.0, 1e-4);
}

TEST(Optimizers, NamesAreChecked) {
  EXPECT_TRUE(CheckOptimizerName("onebit-adam").ok());
  EXPECT_TRUE(CheckOptimizerName("sgd").ok());
  EXPECT_TRUE(IsOnebitOptimizer("onebit-lamb"));
  EXPECT_FALSE(IsOnebitOptimizer("adam"));
  EXPECT_EQ(CheckOptimizerName("adagrad").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tern
