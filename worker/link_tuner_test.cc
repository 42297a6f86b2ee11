#include "worker/link_tuner.h"

#include <memory>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<LinkTuner> Tuner(const std::string& start, int overlap_steps = 0) {
  const auto codecs = NewBuiltinCodecRegistry();
  absl::StatusOr<std::unique_ptr<LinkTuner>> t =
      LinkTuner::Create({.codecs = {"none", "int8", "fp4"},
                         .start = start,
                         .cu_target = 0.9,
                         .exchanges_per_window = 2,
                         .overlap_steps = overlap_steps},
                        *codecs);
  EXPECT_THAT(t, IsOk());
  return t.ok() ? *std::move(t) : nullptr;
}

// A window of 10 steps of `step` s each, `wait` s of them waiting, and 2 exchanges of 4 MB whose
// pushes took `push` s; then the decision.
std::optional<LinkTuner::Change> Window(LinkTuner& t, double step, double wait, double push) {
  for (int i = 0; i < 10; ++i) t.ObserveStep(step, wait);
  for (int i = 0; i < 2; ++i) t.ObserveExchange(4'000'000, push);
  return t.Decide();
}

TEST(LinkTuner, AnUpdateTheLinkCannotCarryInTimeGoesOneRungNarrowerSayingWhy) {
  std::unique_ptr<LinkTuner> t = Tuner("none");
  const std::optional<LinkTuner::Change> c = Window(*t, 1.0, 0.5, 2.5);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->codec, "int8");
  EXPECT_THAT(c->why, HasSubstr("compute utilization 50% < 90%"));
  EXPECT_THAT(c->why, HasSubstr("4.00 MB in none took 2.500 s"));
  const LinkState s = t->Snapshot();
  EXPECT_EQ(s.codec, "int8");
  EXPECT_EQ(s.changes, 1u);
  EXPECT_NEAR(s.cu, 0.5, 1e-9);
  EXPECT_NEAR(s.megabytes_per_second, 1.6, 1e-9);
  EXPECT_EQ(Window(*t, 1.0, 0.5, 1.0)->codec, "fp4");
  EXPECT_FALSE(Window(*t, 1.0, 0.5, 0.5).has_value()) << "no narrower rung";
}

TEST(LinkTuner, ALinkWithRoomWidensOneRungAWindow) {
  std::unique_ptr<LinkTuner> t = Tuner("fp4");
  // 2 exchanges in 10 steps of 0.5 s compute: int8 (1.9x fp4's bytes) would wait 0.038 s twice.
  const std::optional<LinkTuner::Change> c = Window(*t, 0.5, 0, 0.02);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->codec, "int8");
  EXPECT_THAT(c->why, HasSubstr("would keep compute utilization at 99% >= 90%"));
  EXPECT_EQ(Window(*t, 0.5, 0, 0.04)->codec, "none");
  EXPECT_FALSE(Window(*t, 0.5, 0, 0.1).has_value()) << "no wider rung";
}

TEST(LinkTuner, AWiderRungThatWouldMissTheTargetIsNotTried) {
  std::unique_ptr<LinkTuner> t = Tuner("int8");
  // none is 4x int8's bytes: 4 s a push, 0.8 s a step waited against 0.5 of compute.
  EXPECT_FALSE(Window(*t, 0.5, 0, 1.0).has_value());
  EXPECT_EQ(t->Snapshot().codec, "int8");
}

TEST(LinkTuner, WaitingThatTheOverlapHidesFromTheLinkDoesNotNarrow) {
  // A straggling peer: half of each step waited, but the pushes take 0.3 s and two steps of
  // 0.5 s compute overlap each; nothing narrower would help.
  std::unique_ptr<LinkTuner> t = Tuner("none", /*overlap_steps=*/2);
  EXPECT_FALSE(Window(*t, 1.0, 0.5, 0.3).has_value());
}

TEST(LinkTuner, ARungLeftForBeingSlowIsHeldOffLongerEachTime) {
  std::unique_ptr<LinkTuner> t = Tuner("int8");
  ASSERT_EQ(Window(*t, 1.0, 0.5, 2.0)->codec, "fp4");
  EXPECT_FALSE(Window(*t, 0.5, 0, 0.01).has_value()) << "held off one window";
  ASSERT_EQ(Window(*t, 0.5, 0, 0.01)->codec, "int8");
  ASSERT_EQ(Window(*t, 1.0, 0.5, 2.0)->codec, "fp4");
  EXPECT_FALSE(Window(*t, 0.5, 0, 0.01).has_value());
  EXPECT_FALSE(Window(*t, 0.5, 0, 0.01).has_value()) << "held off two windows";
  EXPECT_EQ(Window(*t, 0.5, 0, 0.01)->codec, "int8");
  EXPECT_EQ(t->Snapshot().changes, 4u);
}

TEST(LinkTuner, ItDecidesOnlyOnAFullWindowOfMeasuredExchanges) {
  std::unique_ptr<LinkTuner> t = Tuner("none");
  for (int i = 0; i < 10; ++i) t->ObserveStep(1.0, 0.5);
  t->ObserveExchange(4'000'000, 2.5);
  EXPECT_FALSE(t->Decide().has_value()) << "one exchange of two";
  t->ObserveExchange(4'000'000, 2.5);
  EXPECT_TRUE(t->Decide().has_value());
  // Pushes that failed fill a window but tell nothing of the link.
  for (int i = 0; i < 10; ++i) t->ObserveStep(1.0, 0.5);
  t->ObserveExchange(4'000'000, 0);
  t->ObserveExchange(4'000'000, 0);
  EXPECT_FALSE(t->Decide().has_value());
}

TEST(LinkTuner, ItRefusesALadderItCannotClimb) {
  const auto codecs = NewBuiltinCodecRegistry();
  EXPECT_THAT(LinkTuner::Create({.codecs = {}, .start = "none"}, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no codecs")));
  EXPECT_THAT(LinkTuner::Create({.codecs = {"none", "fp4"}, .start = "int8"}, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not on --codec_ladder")));
  EXPECT_THAT(LinkTuner::Create({.codecs = {"fp4", "none"}, .start = "fp4"}, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("widest first")));
  EXPECT_THAT(LinkTuner::Create({.codecs = {"none", "nope"}, .start = "none"}, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nope")));
  EXPECT_THAT(LinkTuner::Create({.codecs = {"none"}, .start = "none", .cu_target = 1.0}, *codecs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--cu_target")));
}

}  // namespace
}  // namespace tern
