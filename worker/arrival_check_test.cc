#include "worker/arrival_check.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/status_matchers.h"
#include "worker/gossip_bundle.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kNumel = 64;

// Worker 0 of 4 on a ring (neighbours 1 and 3), messages of one part "x" in fp32.
struct Fixture {
  explicit Fixture(double guard_factor = 0, int64_t sync_steps = 0,
                   std::vector<std::string> optional_parts = {})
      : codecs(NewBuiltinCodecRegistry()),
        topology(*NewBuiltinTopologyRegistry()->Create("ring")),
        check(ArrivalCheckOptions{.run_id = "run",
                                  .worker_id = 0,
                                  .num_workers = 4,
                                  .norm_guard = {.factor = guard_factor, .min_samples = 1},
                                  .sync_steps = sync_steps},
              topology.get(), codecs.get(), {"x"}, std::move(optional_parts)) {}

  GossipMessage Message(float value, const std::string& part = "x") const {
    GossipMessage msg;
    EncodedTensor t;
    const std::vector<float> x(kNumel, value);
    EXPECT_THAT((*codecs->Create("none"))->Encode(x, EncodeOptions(), &t), IsOk());
    msg.parts.emplace_back(part, std::move(t));
    return msg;
  }
  ReceivedBundle From(int sender, float value, const std::string& run = "run",
                      const std::string& part = "x", int64_t round = 3) const {
    return ReceivedBundle{GossipToBundle(Message(value, part), run, round, sender), {}};
  }

  std::unique_ptr<CodecRegistry> codecs;
  std::unique_ptr<Topology> topology;
  ArrivalCheck check;
};

TEST(ArrivalCheck, ANeighboursMessageOfThisRunIsTakenAndMarkedChecked) {
  Fixture f;
  absl::StatusOr<std::pair<int, GossipMessage>> got = f.check.Check(f.From(3, 0.5f), 0, kNumel);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->first, 3);
  EXPECT_TRUE(got->second.checked);
}

TEST(ArrivalCheck, ItRefusesAnotherRunItselfAStrangerAndTheWrongPartsNamingWhy) {
  Fixture f;
  EXPECT_THAT(f.check.Check(f.From(1, 0.5f, "other"), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("run 'other'")));
  EXPECT_THAT(f.check.Check(f.From(0, 0.5f), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not another worker")));
  EXPECT_THAT(f.check.Check(f.From(2, 0.5f), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a neighbour")));
  EXPECT_THAT(f.check.Check(f.From(1, 0.5f, "run", "m"), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lacks part 'x'")));
  EXPECT_THAT(f.check.Check(f.From(1, 0.5f), 0, 0),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no model")));
}

// CHOCO's "hat" (a whole public copy, sent when asked for) may come with the parts every
// message carries; a part the algorithm does not send is refused, as is one that would not decode.
TEST(ArrivalCheck, AnOptionalPartMayComeAndAnUnknownOneIsRefused) {
  Fixture f(0, 0, {"hat"});
  const auto with = [&](const std::string& extra, bool corrupt) {
    GossipMessage msg = f.Message(0.5f);
    GossipMessage more = f.Message(1.0f, extra);
    if (corrupt) more.parts[0].second.payload.resize(7);
    msg.parts.push_back(std::move(more.parts[0]));
    return ReceivedBundle{GossipToBundle(std::move(msg), "run", 3, 1), {}};
  };
  EXPECT_THAT(f.check.Check(f.From(1, 0.5f), 0, kNumel).status(), IsOk());
  absl::StatusOr<std::pair<int, GossipMessage>> got = f.check.Check(with("hat", false), 0, kNumel);
  ASSERT_THAT(got, IsOk());
  EXPECT_NE(got->second.Find("hat"), nullptr);
  EXPECT_THAT(f.check.Check(with("m", false), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("and any of hat")));
  EXPECT_THAT(f.check.Check(with("hat", true), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hat")));
  EXPECT_THAT(f.check.Check(f.From(1, 0.5f, "run", "hat"), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lacks part 'x'")));
}

// The resync list (CHOCO's ask for whole copies) goes out and back as it was; a list longer
// than any run is refused before anything else is read.
TEST(GossipBundle, AResyncListComesBackAsSentAndAnOversizedOneIsRefused) {
  Fixture f;
  GossipMessage msg = f.Message(0.5f);
  msg.resync = {1, 3};
  v1::TensorBundle b = GossipToBundle(std::move(msg), "run", 3, 1);
  absl::StatusOr<GossipMessage> back = GossipFromBundle(b, kNumel);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->resync, (std::vector<int>{1, 3}));
  for (int i = 0; i < kMaxResync; ++i) b.add_resync(0);
  EXPECT_THAT(GossipFromBundle(b, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("resync list")));
  b.clear_resync();
  b.add_resync(uint32_t{1} << 31);
  EXPECT_THAT(GossipFromBundle(b, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("resync names worker")));
}

TEST(GossipBundle, AProposedHComesBackAsSentAndAnOversizedOneIsRefused) {
  Fixture f;
  GossipMessage msg = f.Message(0.5f);
  msg.propose_local_steps = 16;
  msg.propose_fragments = 2;
  v1::TensorBundle b = GossipToBundle(std::move(msg), "run", 3, 1);
  absl::StatusOr<GossipMessage> back = GossipFromBundle(b, kNumel);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->propose_local_steps, 16u);
  EXPECT_EQ(back->propose_fragments, 2u);
  b.set_propose_fragments(kMaxFragments + 1);
  EXPECT_THAT(GossipFromBundle(b, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1025 fragments")));
  b.set_propose_fragments(0);
  b.set_propose_local_steps(0);
  back = GossipFromBundle(b, kNumel);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->propose_local_steps, std::nullopt) << "0: no proposal";
  b.set_propose_local_steps(kMaxLocalSteps + 1);
  EXPECT_THAT(GossipFromBundle(b, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps between exchanges")));
}

TEST(ArrivalCheck, TheNormGuardComparesEachBucketsPartsWithThisWorkersOwn) {
  Fixture f(/*guard_factor=*/10);
  // Nothing of ours observed yet: nothing to compare with.
  EXPECT_THAT(f.check.Check(f.From(1, 100.0f), 0, kNumel).status(), IsOk());
  f.check.ObserveOwn(0, 3, f.Message(1.0f));
  EXPECT_THAT(f.check.Check(f.From(1, 5.0f), 0, kNumel).status(), IsOk());
  EXPECT_THAT(f.check.Check(f.From(1, 30.0f), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--norm_guard")));
  // Bucket 1 has its own reference, none yet.
  EXPECT_THAT(f.check.Check(f.From(1, 30.0f), 1, kNumel).status(), IsOk());
}

// diloco's warm-up (rounds 0-9 here) exchanges one step's move; its outer rounds H steps'. An
// outer round 20x a warm-up exchange is not refused for it, and each kind keeps its own bound.
TEST(ArrivalCheck, TheWarmUpsRoundsAndTheOuterRoundsAreJudgedApart) {
  Fixture f(/*guard_factor=*/10, /*sync_steps=*/10);
  for (int64_t r = 0; r < 10; ++r) f.check.ObserveOwn(0, r, f.Message(0.1f));
  EXPECT_THAT(f.check.Check(f.From(1, 5.0f, "run", "x", /*round=*/9), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--norm_guard")));
  EXPECT_THAT(f.check.Check(f.From(1, 2.0f, "run", "x", /*round=*/10), 0, kNumel).status(), IsOk());
  f.check.ObserveOwn(0, 10, f.Message(2.0f));
  EXPECT_THAT(f.check.Check(f.From(1, 2.5f, "run", "x", /*round=*/20), 0, kNumel).status(), IsOk());
  EXPECT_THAT(f.check.Check(f.From(1, 30.0f, "run", "x", /*round=*/20), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--norm_guard")));
}

// When the group moves diloco's H 4x as long, the outer rounds' reference grows 4x with it (an
// update over 4x the steps is at most 4x the norm): a peer's first update over the new H is not
// refused for it, and the warm-up's reference stays.
TEST(ArrivalCheck, TheOuterRoundsReferenceScalesWithH) {
  Fixture f(/*guard_factor=*/10, /*sync_steps=*/10);
  f.check.ObserveOwn(0, 9, f.Message(0.1f));
  f.check.ObserveOwn(0, 11, f.Message(1.0f));
  EXPECT_THAT(f.check.Check(f.From(1, 30.0f, "run", "x", /*round=*/19), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--norm_guard")));
  f.check.ScaleOuterReference(0, 4);
  EXPECT_THAT(f.check.Check(f.From(1, 30.0f, "run", "x", /*round=*/19), 0, kNumel).status(),
              IsOk());
  EXPECT_THAT(f.check.Check(f.From(1, 50.0f, "run", "x", /*round=*/19), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--norm_guard")));
  EXPECT_THAT(f.check.Check(f.From(1, 5.0f, "run", "x", /*round=*/9), 0, kNumel),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--norm_guard")));
}

}  // namespace
}  // namespace tern
