#include "core/model/norm_guard.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

TEST(NormGuard, PassesEverythingUntilItHasSeenEnough) {
  NormGuard g(NormGuardOptions{});
  EXPECT_THAT(g.Check(1e30, "update"), IsOk());
  g.Observe(1.0);
  g.Observe(1.0);
  EXPECT_THAT(g.Check(1e30, "update"), IsOk());
  g.Observe(1.0);
  EXPECT_THAT(g.Check(1e30, "update"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(NormGuard, RefusesNormsOverTheFactorTimesTheMedianAndNamesTheFlag) {
  NormGuardOptions o;
  o.factor = 10;
  o.flag = "--norm_guard";
  NormGuard g(o);
  for (double n : {1.0, 2.0, 3.0, 1000.0}) g.Observe(n);  // one outlier does not move the median
  EXPECT_DOUBLE_EQ(g.Reference(), 3.0);
  EXPECT_THAT(g.Check(29.9, "part 'x'"), IsOk());
  EXPECT_THAT(g.Check(30.1, "part 'x'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("part 'x'"), HasSubstr("--norm_guard=0"))));
  EXPECT_THAT(g.Check(std::nan(""), "u"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(NormGuard, ForgetsOldNormsAndCanBeTurnedOff) {
  NormGuardOptions o;
  o.window = 4;
  NormGuard g(o);
  for (int i = 0; i < 4; ++i) g.Observe(1000.0);
  for (int i = 0; i < 4; ++i) g.Observe(1.0);  // the model settled: only recent norms count
  EXPECT_THAT(g.Check(100.0, "m"), StatusIs(absl::StatusCode::kInvalidArgument));
  o.factor = 0;
  NormGuard off(o);
  for (int i = 0; i < 4; ++i) off.Observe(1.0);
  EXPECT_THAT(off.Check(1e30, "m"), IsOk());
}

TEST(NormGuard, AZeroReferenceJudgesNothing) {
  NormGuard g(NormGuardOptions{});
  for (int i = 0; i < 5; ++i) g.Observe(0.0);
  EXPECT_THAT(g.Check(5.0, "m"), IsOk());
}

}  // namespace
}  // namespace tern
