#include "core/workload/builtin_model.h"

#include <cmath>
#include <vector>

#include "core/workload/dataset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

// Central differences in float: compares each analytic partial with (L(p+h) - L(p-h)) / 2h.
void ExpectGradientMatchesFiniteDifferences(const char* spec) {
  constexpr size_t kDim = 7, kBatch = 5;
  constexpr int kClasses = 4;
  auto model = CreateModel(spec, kDim, kClasses);
  ASSERT_THAT(model, IsOk());
  std::vector<float> p((*model)->NumParams());
  (*model)->Init(3, absl::MakeSpan(p));
  // Non-zero biases so every ReLU branch is exercised away from its kink.
  const auto noise = testing::Gaussian(p.size(), 4, 0.1f);
  for (size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
  const auto x = testing::Gaussian(kDim * kBatch, 5);
  const std::vector<uint8_t> y = {0, 3, 1, 2, 3};
  std::vector<float> g(p.size()), scratch(p.size());
  (*model)->LossAndGradient(p, x.data(), y.data(), kBatch, absl::MakeSpan(g));
  const float h = 1e-2f;
  double worst = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const float saved = p[i];
    p[i] = saved + h;
    const double up =
        (*model)->LossAndGradient(p, x.data(), y.data(), kBatch, absl::MakeSpan(scratch));
    p[i] = saved - h;
    const double down =
        (*model)->LossAndGradient(p, x.data(), y.data(), kBatch, absl::MakeSpan(scratch));
    p[i] = saved;
    const double numeric = (up - down) / (2 * h);
    const double err =
        std::fabs(numeric - g[i]) / std::max(1e-2, std::fabs(numeric) + std::fabs(g[i]));
    worst = std::max(worst, err);
    EXPECT_LT(err, 2e-2) << spec << " parameter " << i << ": analytic " << g[i] << " numeric "
                         << numeric;
  }
  ::testing::Test::RecordProperty("worst_relative_error", std::to_string(worst));
}

TEST(Model, SoftmaxGradientMatchesFiniteDifferences) {
  ExpectGradientMatchesFiniteDifferences("softmax");
}

TEST(Model, MlpGradientMatchesFiniteDifferences) {
  ExpectGradientMatchesFiniteDifferences("mlp:hidden=6x5");
}

// What a worker relies on to send (and update) a layer during the backward pass: each call says
// a suffix of the gradient is final, a layer at a time from the last, and the parameters there
// are not read again (poisoning them then leaves the gradient unchanged).
TEST(Model, MlpSaysEachLayersGradientIsFinalAndItsParametersAreNoLongerRead) {
  constexpr size_t kDim = 7, kBatch = 5;
  auto model = CreateModel("mlp:hidden=6x5", kDim, 4);
  ASSERT_THAT(model, IsOk());
  std::vector<float> p((*model)->NumParams());
  (*model)->Init(3, absl::MakeSpan(p));
  const auto x = testing::Gaussian(kDim * kBatch, 5);
  const std::vector<uint8_t> y = {0, 3, 1, 2, 3};
  std::vector<float> want(p.size()), g(p.size());
  (*model)->LossAndGradient(p, x.data(), y.data(), kBatch, absl::MakeSpan(want));
  std::vector<size_t> froms;
  (*model)->LossAndGradient(p, x.data(), y.data(), kBatch, absl::MakeSpan(g), [&](size_t from) {
    for (size_t i = from; i < g.size(); ++i) {
      EXPECT_EQ(g[i], want[i]) << "from " << from << ", value " << i;
      p[i] = std::nanf("");  // what a worker's update does to them, as far as this call knows
    }
    froms.push_back(from);
  });
  const auto& layout = (*model)->Layout();  // w0 b0 w1 b1 w2 b2
  EXPECT_THAT(froms, ::testing::ElementsAre(layout[4].offset, layout[2].offset, 0u));
  EXPECT_EQ(g, want);
}

TEST(Model, LayoutCoversTheParametersExactlyOnce) {
  auto model = CreateModel("mlp:hidden=32x16", 784, 10);
  ASSERT_THAT(model, IsOk());
  EXPECT_EQ((*model)->Spec(), "mlp:hidden=32x16");
  size_t next = 0;
  for (const ParamTensor& t : (*model)->Layout()) {
    EXPECT_EQ(t.offset, next) << t.name;
    size_t prod = 1;
    for (int64_t d : t.shape) prod *= d;
    EXPECT_EQ(prod, t.numel) << t.name;
    next += t.numel;
  }
  EXPECT_EQ(next, (*model)->NumParams());
  EXPECT_EQ(next, 784u * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10);
}

TEST(Model, SgdOnSyntheticDataLearns) {
  const TrainTest data = SyntheticData(4000, 1000, 11);
  auto model = CreateModel("mlp:hidden=32", data.train.dim, data.train.num_classes);
  ASSERT_THAT(model, IsOk());
  std::vector<float> p((*model)->NumParams()), g(p.size());
  (*model)->Init(1, absl::MakeSpan(p));
  const double before =
      (*model)->Evaluate(p, data.test.features.data(), data.test.labels.data(), 1000).accuracy;
  constexpr size_t kBatch = 32;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (size_t i = 0; i + kBatch <= data.train.size(); i += kBatch) {
      (*model)->LossAndGradient(p, data.train.row(i), data.train.labels.data() + i, kBatch,
                                absl::MakeSpan(g));
      for (size_t j = 0; j < p.size(); ++j) p[j] -= 0.05f * g[j];
    }
  }
  const EvalResult after =
      (*model)->Evaluate(p, data.test.features.data(), data.test.labels.data(), 1000);
  EXPECT_LT(before, 0.2);
  EXPECT_GT(after.accuracy, 0.8);
  EXPECT_LT(after.loss, 0.7);
}

TEST(Model, BadSpecsAreRejected) {
  EXPECT_THAT(CreateModel("resnet", 784, 10), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CreateModel("mlp:hidden=0", 784, 10), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CreateModel("mlp:hidden=12xx3", 784, 10),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CreateModel("softmax:hidden=3", 784, 10),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CreateModel("softmax", 784, 1), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
