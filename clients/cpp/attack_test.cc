#include "clients/cpp/attack.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

TEST(Attack, ParsesEveryFormAndRefusesTheRest) {
  EXPECT_EQ(ParseAttack("")->kind, Attack::Kind::kNone);
  EXPECT_EQ(ParseAttack("signflip")->value, 1);
  EXPECT_EQ(ParseAttack("signflip:scale=10")->value, 10);
  EXPECT_EQ(ParseAttack("scale:factor=100")->kind, Attack::Kind::kScale);
  EXPECT_EQ(ParseAttack("noise:std=0.5")->value, 0.5);
  EXPECT_EQ(ParseAttack("nan")->kind, Attack::Kind::kNaN);
  for (const char* bad :
       {"flip", "scale", "scale:std=2", "noise:std=-1", "nan:x=1", "signflip:scale=inf"}) {
    EXPECT_THAT(ParseAttack(bad).status(), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(Attack, ReplacesTheUpdateAsDocumented) {
  std::vector<float> u = {1, -2, 3};
  ApplyAttack(*ParseAttack("signflip:scale=10"), 1, absl::MakeSpan(u));
  EXPECT_THAT(u, ::testing::ElementsAre(-10, 20, -30));
  ApplyAttack(*ParseAttack("scale:factor=0.5"), 1, absl::MakeSpan(u));
  EXPECT_THAT(u, ::testing::ElementsAre(-5, 10, -15));
  std::vector<float> n(20000, 7.0f);
  ApplyAttack(*ParseAttack("noise:std=2"), 3, absl::MakeSpan(n));
  double mean = 0, var = 0;
  for (float x : n) mean += x / n.size();
  for (float x : n) var += (x - mean) * (x - mean) / n.size();
  EXPECT_NEAR(mean, 0, 0.05);
  EXPECT_NEAR(std::sqrt(var), 2, 0.05);
  ApplyAttack(*ParseAttack("nan"), 1, absl::MakeSpan(u));
  for (float x : u) EXPECT_TRUE(std::isnan(x));
}

TEST(Attack, TheFirstFractionOfClientsAttack) {
  int attackers = 0;
  for (int i = 0; i < 10; ++i) attackers += IsAttacker(i, 10, 0.2);
  EXPECT_EQ(attackers, 2);
  EXPECT_TRUE(IsAttacker(1, 10, 0.2));
  EXPECT_FALSE(IsAttacker(2, 10, 0.2));
  EXPECT_FALSE(IsAttacker(0, 10, 0.0));
}

}  // namespace
}  // namespace tern
