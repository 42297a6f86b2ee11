#include "common/spec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

TEST(SpecParams, ParsesNameAndTypedParameters) {
  auto parsed = SpecParams::ParseSpec("stc:ratio=0.01,levels=16,flag=true,mode=minmax");
  ASSERT_THAT(parsed, IsOk());
  auto& [name, p] = *parsed;
  EXPECT_EQ(name, "stc");
  EXPECT_EQ(*p.Double("ratio", 1, 0, 1), 0.01);
  EXPECT_EQ(*p.Int("levels", 1, 1, 100), 16);
  EXPECT_EQ(*p.Bool("flag", false), true);
  EXPECT_EQ(*p.Enum("mode", "absmax", {"absmax", "minmax"}), "minmax");
  EXPECT_EQ(*p.Double("absent", 0.5, 0, 1), 0.5);
  EXPECT_THAT(p.CheckAllUsed("stc"), IsOk());
}

TEST(SpecParams, RejectsMalformedSpecs) {
  for (const char* spec : {"", ":ratio=1", "stc:", "stc:ratio", "stc:=1", "stc:ratio=1,ratio=2",
                           "st c", "stc:ratio=1,,x=2", "stc:r=1;x"}) {
    EXPECT_THAT(SpecParams::ParseSpec(spec), StatusIs(absl::StatusCode::kInvalidArgument)) << spec;
  }
}

TEST(SpecParams, RangeTypeAndUnknownKeyErrorsSayWhatIsWrong) {
  auto parsed = SpecParams::ParseSpec("x:ratio=2,levels=1.5,b=maybe,m=foo,typo=1");
  ASSERT_THAT(parsed, IsOk());
  auto& p = parsed->second;
  EXPECT_THAT(p.Double("ratio", 0, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  EXPECT_THAT(p.Int("levels", 0, 0, 9),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("integer")));
  EXPECT_THAT(p.Bool("b", false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("boolean")));
  EXPECT_THAT(p.Enum("m", "a", {"a", "b"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a|b")));
  EXPECT_THAT(p.CheckAllUsed("x"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("typo")));
}

}  // namespace
}  // namespace tern
