#include "kernels/registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/cpu/topk.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CodecRegistry, EveryBuiltinRecreatesItselfFromItsCanonicalSpec) {
  auto registry = NewBuiltinCodecRegistry();
  EXPECT_EQ(registry->Names().size(), 19u);
  for (const std::string& name : registry->Names()) {
    auto codec = registry->Create(name);
    ASSERT_THAT(codec, IsOk()) << name;
    auto again = registry->Create((*codec)->Spec());
    ASSERT_THAT(again, IsOk()) << (*codec)->Spec();
    EXPECT_EQ((*again)->Spec(), (*codec)->Spec());
    EXPECT_THAT(registry->DecoderFor((*codec)->Name()), IsOk());
    // "<name>.v<version>": the wire name starts with the spec name and carries a version.
    EXPECT_THAT(std::string((*codec)->Name()), ::testing::MatchesRegex(name + "\\.v[0-9]+"));
  }
}

TEST(CodecRegistry, UnknownNamesAndParametersAreClearErrors) {
  auto registry = NewBuiltinCodecRegistry();
  EXPECT_THAT(
      registry->Create("topkk:ratio=0.1"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("known: bf16, chunk-topk, dct, dgc")));
  EXPECT_THAT(registry->Create("topk:ratoi=0.1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ratoi")));
  EXPECT_THAT(registry->Create("topk:ratio=2"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  EXPECT_THAT(registry->Create("qsgd:levels=0"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(registry->DecoderFor("topk.v2"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown codec or version")));
}

TEST(CodecRegistry, DuplicateRegistrationFails) {
  CodecRegistry registry;
  ASSERT_THAT(registry.Register("topk", NewTopKCodec), IsOk());
  EXPECT_THAT(registry.Register("topk", NewTopKCodec), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(registry.Register("topk-again", NewTopKCodec),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("wire name")));
}

}  // namespace
}  // namespace tern
