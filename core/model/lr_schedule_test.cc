#include "core/model/lr_schedule.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;

TEST(LrSchedule, CosineRampsUpOverTheWarmUpThenDecaysToItsMinimumAtTheLastStep) {
  auto c = ParseLrSchedule("cosine:warmup=10", 0.1, 110);
  ASSERT_THAT(c, IsOk());
  EXPECT_NEAR(c->At(0), 0.01, 1e-9);
  EXPECT_LT(c->At(4), c->At(5));
  EXPECT_NEAR(c->At(110), 0.0, 1e-9);
  EXPECT_NEAR(c->At(55), 0.05, 1e-9);
  EXPECT_GT(c->At(20), c->At(60));
  auto floor = ParseLrSchedule("cosine:min=0.01", 0.1, 100);
  ASSERT_THAT(floor, IsOk());
  EXPECT_NEAR(floor->At(0), 0.1, 1e-9);
  EXPECT_NEAR(floor->At(100), 0.01, 1e-9);
  EXPECT_NEAR(floor->At(500), 0.01, 1e-9);  // past the end it stays at its minimum
}

TEST(LrSchedule, StepMultipliesByGammaEveryNSteps) {
  auto s = ParseLrSchedule("step:every=10,gamma=0.5", 0.2, 0);
  ASSERT_THAT(s, IsOk());
  EXPECT_NEAR(s->At(9), 0.2, 1e-9);
  EXPECT_NEAR(s->At(10), 0.1, 1e-9);
  EXPECT_NEAR(s->At(25), 0.05, 1e-9);
  auto constant = ParseLrSchedule("constant", 0.3, 0);
  ASSERT_THAT(constant, IsOk());
  EXPECT_NEAR(constant->At(1000), 0.3, 1e-12);
}

TEST(LrSchedule, BadSpecsAreRefusedWithTheReason) {
  EXPECT_FALSE(ParseLrSchedule("step", 0.1, 0).ok());
  EXPECT_FALSE(ParseLrSchedule("linear", 0.1, 0).ok());
  EXPECT_FALSE(ParseLrSchedule("constant", -1, 0).ok());
  EXPECT_FALSE(ParseLrSchedule("cosine:min=0.5", 0.1, 10).ok());  // a minimum above the rate
  EXPECT_FALSE(ParseLrSchedule("cosine:warmup=-1", 0.1, 10).ok());
  EXPECT_FALSE(ParseLrSchedule("cosine:mni=0.01", 0.1, 10).ok());  // a misspelt parameter
}

}  // namespace
}  // namespace tern
