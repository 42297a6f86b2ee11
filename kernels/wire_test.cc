#include "kernels/wire.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

TEST(Wire, EncodedTensorSurvivesProtobufSerialization) {
  auto registry = NewBuiltinCodecRegistry();
  auto codec = registry->Create("stc:ratio=0.05");
  ASSERT_THAT(codec, IsOk());
  const auto x = testing::Gaussian(6000, 401);
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  std::vector<float> direct(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(direct)), IsOk());
  v1::EncodedTensor msg;
  ToProto(std::move(enc), &msg);
  msg.add_shape(60);
  msg.add_shape(100);
  msg.set_dtype(v1::DTYPE_FLOAT32);
  v1::EncodedTensor received;
  ASSERT_TRUE(received.ParseFromString(msg.SerializeAsString()));
  EXPECT_EQ(received.codec(), "stc.v1");
  EXPECT_EQ(received.params(), "ratio=0.05");
  std::vector<float> y(x.size());
  ASSERT_THAT(DecodeMessage(*registry, received, absl::MakeSpan(y)), IsOk());
  EXPECT_EQ(y, direct);
  std::vector<float> acc(x.size(), 1.0f);
  ASSERT_THAT(DecodeAccumulateMessage(*registry, received, 2.0f, absl::MakeSpan(acc)), IsOk());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(acc[i], 1.0f + 2.0f * direct[i]);
}

TEST(Wire, ShapeThatDisagreesWithNumelIsRejected) {
  v1::EncodedTensor msg;
  msg.set_codec("none.v1");
  msg.set_numel(6);
  msg.add_shape(2);
  msg.add_shape(4);
  EXPECT_THAT(ViewOf(msg), StatusIs(absl::StatusCode::kInvalidArgument));
  msg.clear_shape();
  msg.add_shape(-2);
  msg.add_shape(-3);
  EXPECT_THAT(ViewOf(msg), StatusIs(absl::StatusCode::kInvalidArgument));
  msg.clear_shape();
  msg.add_shape(int64_t{1} << 40);
  msg.add_shape(int64_t{1} << 40);
  EXPECT_THAT(ViewOf(msg), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
