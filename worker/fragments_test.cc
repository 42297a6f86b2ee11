#include "worker/fragments.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::testing::ElementsAre;

// A layout of `names` with `numel[i]` values each, in order.
std::vector<ParamTensor> NamedLayout(const std::vector<std::string>& names,
                                     const std::vector<size_t>& numel) {
  std::vector<ParamTensor> layout;
  size_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    layout.push_back({.name = names[i],
                      .shape = {static_cast<int64_t>(numel[i])},
                      .offset = offset,
                      .numel = numel[i]});
    offset += numel[i];
  }
  return layout;
}

TEST(LayerOf, IsThePathToTheFirstNumberElseTheModule) {
  EXPECT_EQ(LayerOf("blocks.3.attn.weight").key, "blocks.3");
  EXPECT_TRUE(LayerOf("blocks.3.attn.weight").numbered);
  EXPECT_EQ(LayerOf("model.layers.12.mlp.up.weight").key, "model.layers.12");
  EXPECT_EQ(LayerOf("ln.weight").key, "ln");
  EXPECT_FALSE(LayerOf("ln.weight").numbered);
  EXPECT_EQ(LayerOf("bias").key, "bias");
  EXPECT_FALSE(LayerOf("fc3x.weight").numbered);  // a number inside a name is not a layer
}

// The race's transformer in two fragments: blocks 0 and 2 in one, 1 and 3 in the other (each
// spans the depth), the embeddings, last norm and head each to the lighter fragment.
TEST(StridedFragments, DealTheLayersOutInTurnAndBalanceTheRest) {
  const std::vector<ParamTensor> layout =
      NamedLayout({"tok.weight", "pos.weight", "blocks.0.w", "blocks.0.b", "blocks.1.w",
                   "blocks.1.b", "blocks.2.w", "blocks.2.b", "blocks.3.w", "blocks.3.b",
                   "ln.weight", "ln.bias", "head.weight"},
                  {32, 16, 100, 4, 100, 4, 100, 4, 100, 4, 2, 2, 32});
  // Fragment 0: blocks 0, 2 (208), then tok (32: both at 208, the first wins); pos to the
  // other (208 < 240), then ln (224 < 240), then head (228 < 240).
  EXPECT_THAT(StridedFragments(layout, 2),
              ElementsAre(ElementsAre(0, 2, 3, 6, 7), ElementsAre(1, 4, 5, 8, 9, 10, 11, 12)));
  // One fragment per block; the rest fill the lightest.
  EXPECT_THAT(StridedFragments(layout, 4),
              ElementsAre(ElementsAre(0, 2, 3), ElementsAre(1, 4, 5), ElementsAre(6, 7, 10, 11),
                          ElementsAre(8, 9, 12)));
  // Every tensor in exactly one fragment, whatever P.
  for (int p : {1, 2, 3, 4, 5, 13, 100}) {
    std::vector<int> seen(layout.size(), 0);
    for (const auto& f : StridedFragments(layout, p)) {
      for (size_t t : f) ++seen[t];
    }
    EXPECT_THAT(seen, ::testing::Each(1)) << p;
  }
}

// More fragments than layers: the empty ones are left out. A model without numbered layers
// (the built-in MLP) deals its modules out in turn; tensors without values are not blocks.
TEST(StridedFragments, LeaveEmptyFragmentsOutAndDealModulesWithoutNumbers) {
  const std::vector<ParamTensor> two = NamedLayout({"blocks.0.w", "blocks.1.w"}, {8, 8});
  EXPECT_THAT(StridedFragments(two, 4), ElementsAre(ElementsAre(0), ElementsAre(1)));
  const std::vector<ParamTensor> mlp =
      NamedLayout({"fc1.weight", "fc1.bias", "empty", "fc2.weight", "fc2.bias", "fc3.weight"},
                  {20, 4, 0, 20, 4, 20});
  EXPECT_THAT(StridedFragments(mlp, 2), ElementsAre(ElementsAre(0, 1, 4), ElementsAre(2, 3)));
}

// Two cuts with lanes of the same sizes differ; the same cut gives the same fingerprint; never 0.
TEST(CutFingerprint, TellsCutsOfEqualSizesApart) {
  const std::vector<std::vector<Piece>> contiguous = {{{0, 8}}, {{8, 8}}};
  const std::vector<std::vector<Piece>> strided = {{{0, 4}, {8, 4}}, {{4, 4}, {12, 4}}};
  EXPECT_NE(CutFingerprint(contiguous), CutFingerprint(strided));
  EXPECT_EQ(CutFingerprint(strided), CutFingerprint({{{0, 4}, {8, 4}}, {{4, 4}, {12, 4}}}));
  EXPECT_NE(CutFingerprint(contiguous), CutFingerprint({{{0, 8}, {8, 8}}}));  // one lane of both
  EXPECT_NE(CutFingerprint({}), 0u);
}

TEST(FragmentCut, ParsesItsNamesAndRefusesOthers) {
  for (FragmentCut c : {FragmentCut::kContiguous, FragmentCut::kStrided}) {
    const absl::StatusOr<FragmentCut> parsed = ParseFragmentCut(FragmentCutName(c));
    ASSERT_THAT(parsed.status(), testing::IsOk());
    EXPECT_EQ(*parsed, c);
  }
  EXPECT_THAT(
      ParseFragmentCut("interleaved").status(),
      testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("strided")));
}

}  // namespace
}  // namespace tern
