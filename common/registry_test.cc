#include "common/registry.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Shape {
  std::string what;
};
using ShapeRegistry = Registry<Shape, int>;

ShapeRegistry::Factory Sized(std::string base) {
  return [base](SpecParams& p, int scale) -> absl::StatusOr<std::unique_ptr<Shape>> {
    absl::StatusOr<int64_t> side = p.Int("side", 1, 1, 10);
    if (!side.ok()) return side.status();
    return std::make_unique<Shape>(Shape{absl::StrCat(base, *side * scale)});
  };
}

TEST(Registry, CreatesFromSpecsWithTheCallersContext) {
  ShapeRegistry r("shape");
  ASSERT_THAT(r.Register("square", Sized("square")), IsOk());
  ASSERT_THAT(r.Register("cube", Sized("cube")), IsOk());
  auto s = r.Create("square:side=3", 2);
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ((*s)->what, "square6");
  EXPECT_THAT(r.Names(), ElementsAre("cube", "square"));
  EXPECT_TRUE(r.Has("cube"));
  EXPECT_FALSE(r.Has("sphere"));
}

TEST(Registry, DuplicateNamesAreErrors) {
  ShapeRegistry r("shape");
  ASSERT_THAT(r.Register("square", Sized("square")), IsOk());
  EXPECT_THAT(r.Register("square", Sized("other")), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(r.Register("", Sized("other")), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ((*r.Create("square", 1))->what, "square1");  // the first one stays
}

TEST(Registry, UnknownNamesListTheKnownOnesAndEveryParameterMustBeUsed) {
  ShapeRegistry r("shape");
  ASSERT_THAT(r.Register("square", Sized("square")), IsOk());
  ASSERT_THAT(r.Register("cube", Sized("cube")), IsOk());
  EXPECT_THAT(r.Create("sphere", 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown shape 'sphere' (known: cube, square)")));
  EXPECT_THAT(r.Create("square:sied=2", 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sied")));
  EXPECT_THAT(r.Create("square:side=11", 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.Create("square:", 1), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
