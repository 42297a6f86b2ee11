#include "core/model/outer.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

std::unique_ptr<OuterOptimizer> NewOuter(const std::string& spec, size_t numel) {
  auto made = NewBuiltinOuterOptimizerRegistry()->Create(spec);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return nullptr;
  (*made)->Reset(numel);
  return *std::move(made);
}

std::vector<float> OuterStepOf(OuterOptimizer& o, const std::vector<float>& mean) {
  std::vector<float> step(mean.size());
  o.Step(mean, absl::MakeSpan(step));
  return step;
}

TEST(OuterOptimizerTest, AverageMovesTheModelToTheWorkersMean) {
  auto o = NewOuter("average", 3);
  EXPECT_THAT(OuterStepOf(*o, {0.5f, -1.0f, 2.0f}), ::testing::ElementsAre(0.5f, -1.0f, 2.0f));
  EXPECT_THAT(OuterStepOf(*o, {1.0f, 0.0f, 0.0f}), ::testing::ElementsAre(1.0f, 0.0f, 0.0f));
  EXPECT_TRUE(o->momentum().empty());
  EXPECT_EQ(o->residual_decay(), 1.0f);
}

TEST(OuterOptimizerTest, NesterovMatchesAHandComputationOfTorchsSgd) {
  // torch.optim.SGD(lr=0.7, momentum=0.9, nesterov=True) on the pseudo-gradient Δ = −ū:
  // v = μ v + Δ; θ −= lr (Δ + μ v). Round 1, ū = 1: v = −1, θ += 0.7 (1 + 0.9) = 1.33.
  // Round 2, ū = 0.5: v = −0.9 − 0.5 = −1.4, θ += 0.7 (0.5 + 0.9 · 1.4) = 1.232.
  auto o = NewOuter("nesterov", 1);
  EXPECT_FLOAT_EQ(OuterStepOf(*o, {1.0f})[0], 1.33f);
  EXPECT_FLOAT_EQ(OuterStepOf(*o, {0.5f})[0], 1.232f);
  EXPECT_FLOAT_EQ(o->momentum()[0], 1.4f);
  EXPECT_EQ(o->Spec(), "nesterov:lr=0.7,momentum=0.9");
}

TEST(OuterOptimizerTest, HeavyBallIsSlowMoBitForBit) {
  // The loop the aggregator ran before outer optimizers were a kind: m = β m + ū; x += lr m.
  const float lr = 0.7f, beta = 0.9f;
  auto o = NewOuter("heavy-ball:lr=0.7,momentum=0.9", 4);
  std::vector<float> m(4, 0.0f);
  for (int round = 0; round < 20; ++round) {
    std::vector<float> mean(4);
    for (int i = 0; i < 4; ++i)
      mean[i] = 0.013f * static_cast<float>((round * 7 + i * 3) % 11) - 0.05f;
    std::vector<float> want(4);
    for (int i = 0; i < 4; ++i) {
      m[i] = beta * m[i] + mean[i];
      want[i] = lr * m[i];
    }
    EXPECT_EQ(OuterStepOf(*o, mean), want) << "round " << round;
  }
}

TEST(OuterOptimizerTest, ZeroMomentumUnitLrIsPlainAveragingForEveryMomentumKind) {
  for (const char* spec :
       {"heavy-ball:lr=1,momentum=0", "nesterov:lr=1,momentum=0", "sparseloco:lr=1,beta=0"}) {
    auto o = NewOuter(spec, 2);
    EXPECT_THAT(OuterStepOf(*o, {0.25f, -3.0f}), ::testing::ElementsAre(0.25f, -3.0f)) << spec;
    EXPECT_THAT(OuterStepOf(*o, {1.0f, 2.0f}), ::testing::ElementsAre(1.0f, 2.0f)) << spec;
  }
}

TEST(OuterOptimizerTest, SparseLoCoKeepsNoOuterMomentumAndDecaysTheSendersResidual) {
  auto o = NewOuter("sparseloco", 2);
  EXPECT_EQ(o->Spec(), "sparseloco:lr=1,beta=0.95");
  EXPECT_FLOAT_EQ(o->residual_decay(), 0.95f);
  EXPECT_TRUE(o->momentum().empty());
  EXPECT_THAT(OuterStepOf(*o, {2.0f, 0.0f}), ::testing::ElementsAre(2.0f, 0.0f));
  EXPECT_THAT(OuterStepOf(*o, {0.0f, 0.0f}), ::testing::ElementsAre(0.0f, 0.0f));
}

TEST(OuterOptimizerTest, ForgetDropsTheMomentumOfAStepNotTaken) {
  auto o = NewOuter("heavy-ball:lr=1,momentum=0.5", 1);
  OuterStepOf(*o, {4.0f});
  o->Forget();
  EXPECT_THAT(OuterStepOf(*o, {1.0f}), ::testing::ElementsAre(1.0f));
}

TEST(OuterOptimizerTest, RestoreTakesBackTheMomentumAndRefusesAnotherModels) {
  auto a = NewOuter("nesterov", 3);
  OuterStepOf(*a, {1.0f, 2.0f, 3.0f});
  std::vector<float> saved(a->momentum().begin(), a->momentum().end());
  auto b = NewOuter("nesterov", 3);
  ASSERT_TRUE(b->Restore(saved).ok());
  EXPECT_EQ(OuterStepOf(*a, {0.5f, 0.5f, 0.5f}), OuterStepOf(*b, {0.5f, 0.5f, 0.5f}));
  auto c = NewOuter("nesterov", 2);
  EXPECT_EQ(c->Restore(saved).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(c->Restore({}).ok());
}

TEST(OuterOptimizerTest, BadSpecsSayWhatIsAllowed) {
  auto r = NewBuiltinOuterOptimizerRegistry();
  EXPECT_EQ(r->Names(),
            (std::vector<std::string>{"average", "heavy-ball", "nesterov", "sparseloco"}));
  for (const char* bad : {"adam", "nesterov:lr=0", "nesterov:momentum=1", "sparseloco:beta=1.5",
                          "average:lr=2", "heavy-ball:mu=0.9"}) {
    auto made = r->Create(bad);
    EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// Every registered one, at its defaults: the first step points the way the workers went, and a
// restored copy steps exactly as the original does.
TEST(OuterOptimizerTest, EveryOuterOptimizerStepsTowardsTheWorkersAndRestoresExactly) {
  auto r = NewBuiltinOuterOptimizerRegistry();
  for (const std::string& name : r->Names()) {
    auto a = NewOuter(name, 3);
    const std::vector<float> first = OuterStepOf(*a, {1.0f, -2.0f, 0.5f});
    EXPECT_GT(first[0], 0) << name;
    EXPECT_LT(first[1], 0) << name;
    auto b = NewOuter(name, 3);
    std::vector<float> saved(a->momentum().begin(), a->momentum().end());
    ASSERT_TRUE(b->Restore(saved).ok()) << name;
    EXPECT_EQ(OuterStepOf(*a, {0.25f, 0.25f, -1.0f}), OuterStepOf(*b, {0.25f, 0.25f, -1.0f}))
        << name;
    EXPECT_EQ(r->Create(a->Spec()).status().code(), absl::StatusCode::kOk) << a->Spec();
  }
}

// Preview gives the step Step would give and leaves the momentum alone: after previews, the next
// Step is the one an optimizer that never previewed takes.
TEST(OuterOptimizerTest, PreviewIsTheNextStepWithoutTakingIt) {
  auto r = NewBuiltinOuterOptimizerRegistry();
  for (const std::string& name : r->Names()) {
    auto a = NewOuter(name, 2);
    auto b = NewOuter(name, 2);
    OuterStepOf(*a, {1.0f, -0.5f});
    OuterStepOf(*b, {1.0f, -0.5f});
    std::vector<float> preview(2);
    a->Preview({3.0f, 3.0f}, absl::MakeSpan(preview));
    a->Preview({0.25f, 2.0f}, absl::MakeSpan(preview));
    EXPECT_EQ(preview, OuterStepOf(*b, {0.25f, 2.0f})) << name;
    EXPECT_EQ(OuterStepOf(*a, {0.25f, 2.0f}), preview) << name;
  }
}

TEST(OuterOptimizerTest, HeavyBallTakesANegativeLrForAGradient) {
  auto o = NewHeavyBallOuterOptimizer(-0.1f, 0.0f);
  o->Reset(1);
  EXPECT_THAT(OuterStepOf(*o, {2.0f}), ::testing::ElementsAre(-0.1f * 2.0f));
}

}  // namespace
}  // namespace tern
