#include "server/downstream.h"

#include <string>
#include <vector>

#include "core/federated/protocol.h"
#include "core/model/bundle.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::tern::testing::ValueOrFailure;

std::vector<ParamTensor> TwoTensors() { return {{"w", {8, 16}, 0, 128}, {"b", {16}, 128, 16}}; }

// A client that holds round 0's model and applies every kept update lands on the server's model
// bit for bit; a client too far behind (or ahead) gets the model.
TEST(DeltaDownstream, ACatchUpFromKeptUpdatesIsBitExactAndTooOldMeansTheModel) {
  auto codecs = NewBuiltinCodecRegistry();
  const std::vector<ParamTensor> layout = TwoTensors();
  DeltaDownstream down(codecs.get(), "topk:ratio=0.1", 7, /*keep=*/3);
  down.Reset(layout);
  std::vector<float> model = testing::Gaussian(144, 1);
  const std::vector<float> start = model;
  for (int64_t round = 1; round <= 5; ++round) {
    ASSERT_TRUE(ValueOrFailure(down.Apply(testing::Gaussian(144, 10 + round), round, &model)));
  }
  EXPECT_EQ(down.CatchUpFrom(5, 5), 5);
  EXPECT_EQ(down.CatchUpFrom(6, 5), -1);
  EXPECT_EQ(down.CatchUpFrom(0, 5), -1);  // rounds 1 and 2 are no longer kept (keep = 3)
  ASSERT_EQ(down.CatchUpFrom(2, 5), 2);
  // Replay from round 2: rebuild the model of round 2 first with a second downstream.
  DeltaDownstream replay(codecs.get(), "topk:ratio=0.1", 7, 3);
  replay.Reset(layout);
  std::vector<float> at2 = start;
  for (int64_t round = 1; round <= 2; ++round) {
    ASSERT_TRUE(ValueOrFailure(replay.Apply(testing::Gaussian(144, 10 + round), round, &at2)));
  }
  const v1::TensorBundle payload = ValueOrFailure(down.Payload(2, model, v1::TensorBundle(), 0));
  EXPECT_EQ(payload.tensors_size(), 6);  // rounds 3, 4, 5 x two tensors
  ASSERT_THAT(ApplyDeltas(payload, layout, *codecs, absl::MakeSpan(at2)), IsOk());
  EXPECT_EQ(at2, model);
}

TEST(DeltaDownstream, TheResidualCarriesWhatTheCodecLeftOutAndSurvivesACheckpoint) {
  auto codecs = NewBuiltinCodecRegistry();
  DeltaDownstream down(codecs.get(), "topk:ratio=0.1", 7, 10);
  down.Reset(TwoTensors());
  std::vector<float> model(144, 0.0f);
  const std::vector<float> step = testing::Gaussian(144, 3);
  ASSERT_TRUE(ValueOrFailure(down.Apply(step, 1, &model)));
  internal::DownstreamState state;
  down.Save(&state);
  ASSERT_EQ(state.residual_size(), 144);
  // model + residual = step: nothing was lost, only deferred.
  for (int i = 0; i < 144; ++i) EXPECT_NEAR(model[i] + state.residual(i), step[i], 1e-6f) << i;
  DeltaDownstream again(codecs.get(), "topk:ratio=0.1", 7, 10);
  again.Reset(TwoTensors());
  ASSERT_THAT(again.Restore(state), IsOk());
  internal::DownstreamState wrong;
  wrong.add_residual(1.0f);
  EXPECT_THAT(again.Restore(wrong), StatusIs(absl::StatusCode::kDataLoss));
}

// DCT's threshold (the codec's encoder state) is saved with the residual: a server restored from
// the checkpoint encodes the next rounds as the one that kept running, and a fresh one would not.
TEST(DeltaDownstream, TheCodecsEncoderStateSurvivesACheckpoint) {
  auto codecs = NewBuiltinCodecRegistry();
  const std::string dct = "dct:ratio=0.1,every=4";
  DeltaDownstream down(codecs.get(), dct, 7, 10);
  down.Reset(TwoTensors());
  std::vector<float> model(144, 0.0f);
  ASSERT_TRUE(ValueOrFailure(down.Apply(testing::Gaussian(144, 3), 1, &model)));
  internal::DownstreamState state;
  down.Save(&state);
  ASSERT_EQ(state.codec_state_size(), 2);
  DeltaDownstream again(codecs.get(), dct, 7, 10), fresh(codecs.get(), dct, 7, 10);
  again.Reset(TwoTensors());
  fresh.Reset(TwoTensors());
  ASSERT_THAT(again.Restore(state), IsOk());
  internal::DownstreamState residual_only = state;
  residual_only.clear_codec_state();
  ASSERT_THAT(fresh.Restore(residual_only), IsOk());
  std::vector<float> model_again = model, model_fresh = model;
  for (int64_t round = 2; round <= 4; ++round) {
    const std::vector<float> step = testing::Gaussian(144, 10 + round, 2.0f);
    ASSERT_TRUE(ValueOrFailure(down.Apply(step, round, &model)));
    ASSERT_TRUE(ValueOrFailure(again.Apply(step, round, &model_again)));
    ASSERT_TRUE(ValueOrFailure(fresh.Apply(step, round, &model_fresh)));
  }
  EXPECT_EQ(model_again, model);
  EXPECT_NE(model_fresh, model);
  // A state of another layout, or one the codec could not have saved, is damage.
  internal::DownstreamState wrong = state;
  wrong.add_codec_state("");
  EXPECT_THAT(again.Restore(wrong), StatusIs(absl::StatusCode::kDataLoss));
  wrong = state;
  wrong.set_codec_state(0, "junk");
  EXPECT_THAT(again.Restore(wrong), StatusIs(absl::StatusCode::kDataLoss));
  // A model downstream keeps no codec state.
  ModelDownstream plain(codecs.get(), "none");
  residual_only.clear_residual();
  residual_only.add_codec_state("");
  EXPECT_THAT(plain.Restore(residual_only), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(Downstream, AStepThatWouldOverflowTheModelLeavesItAsItWas) {
  auto codecs = NewBuiltinCodecRegistry();
  ModelDownstream model_down(codecs.get(), "none");
  DeltaDownstream delta_down(codecs.get(), "none", 7, 10);
  for (Downstream* down : std::vector<Downstream*>{&model_down, &delta_down}) {
    down->Reset(TwoTensors());
    std::vector<float> model(144, 3e38f);
    std::vector<float> step(144, 3e38f);
    EXPECT_FALSE(ValueOrFailure(down->Apply(step, 1, &model)));
    EXPECT_EQ(model, std::vector<float>(144, 3e38f));
  }
}

TEST(ModelDownstream, ALossyModelIsEncodedAndAnExactOneIsThePublishedBundle) {
  auto codecs = NewBuiltinCodecRegistry();
  const std::vector<ParamTensor> layout = TwoTensors();
  const std::vector<float> model = testing::Gaussian(144, 5);
  const v1::TensorBundle exact = ValueOrFailure(FlatToBundle(layout, model));
  ModelDownstream none(codecs.get(), "none");
  none.Reset(layout);
  EXPECT_TRUE(none.exact());
  EXPECT_EQ(ValueOrFailure(none.Payload(-1, model, exact, 1)).SerializeAsString(),
            exact.SerializeAsString());
  ModelDownstream fp16(codecs.get(), "fp16");
  fp16.Reset(layout);
  EXPECT_FALSE(fp16.exact());
  const v1::TensorBundle b = ValueOrFailure(fp16.Payload(-1, model, exact, 1));
  EXPECT_LT(PayloadBytes(b), PayloadBytes(exact));
  std::vector<float> decoded(144);
  ASSERT_THAT(BundleToFlat(b, layout, *codecs, absl::MakeSpan(decoded)), IsOk());
  for (int i = 0; i < 144; ++i) EXPECT_NEAR(decoded[i], model[i], 2e-3f * std::abs(model[i]));
}

}  // namespace
}  // namespace tern
