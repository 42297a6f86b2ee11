#include "core/model/bundle.h"

#include <cstring>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

// Two 16 x 8 matrices, flat.
std::vector<ParamTensor> TwoMatrices() {
  return {{"a", {16, 8}, 0, 128}, {"b", {16, 8}, 128, 128}};
}

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 37) % 23) - 5.0f;
  return v;
}

std::vector<float> Payload(const v1::NamedTensor& nt) {
  std::vector<float> v(nt.tensor().payload().size() / 4);
  std::memcpy(v.data(), nt.tensor().payload().data(), v.size() * 4);
  return v;
}

TEST(Bundle, FlatToBundleRoundTripsExactlyWithShapes) {
  auto codecs = NewBuiltinCodecRegistry();
  const std::vector<float> x = Ramp(256, 0.5f);
  auto b = FlatToBundle(TwoMatrices(), x);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_THAT(b->tensors(1).tensor().shape(), ::testing::ElementsAre(16, 8));
  std::vector<float> back(256);
  ASSERT_THAT(BundleToFlat(*b, TwoMatrices(), *codecs, absl::MakeSpan(back)), IsOk());
  EXPECT_EQ(back, x);
}

TEST(Bundle, AnExactTensorGoesWholeWithItsResidualAndTheRestAreEncoded) {
  auto registry = NewBuiltinCodecRegistry();
  TensorCodecs codecs(registry.get());
  ASSERT_THAT(codecs.Use("topk:ratio=0.1", 2), IsOk());
  const std::vector<float> x = Ramp(256, 0.25f);
  std::vector<float> residual(256, 0.5f);
  auto b = EncodeFlatToBundle(TwoMatrices(), x, codecs, EncodeOptions(), &residual, {false, true});
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_NE(b->tensors(0).tensor().codec(), "none.v1");
  ASSERT_EQ(b->tensors(1).tensor().codec(), "none.v1");
  const std::vector<float> sent = Payload(b->tensors(1));
  ASSERT_EQ(sent.size(), 128u);
  for (size_t j = 0; j < 128; ++j) EXPECT_EQ(sent[j], x[128 + j] + 0.5f) << j;
  for (size_t j = 128; j < 256; ++j) EXPECT_EQ(residual[j], 0.0f) << j;
  // The encoded tensor kept what top-k left out.
  int kept = 0;
  for (size_t j = 0; j < 128; ++j) kept += residual[j] != 0.0f;
  EXPECT_GT(kept, 100);
}

TEST(Bundle, AStatefulCodecNeverSeesAnExactTensor) {
  // PowerSGD warm-starts Q from the previous encode: rounds spent exact must leave it as new.
  auto registry = NewBuiltinCodecRegistry();
  TensorCodecs used(registry.get());
  TensorCodecs fresh(registry.get());
  ASSERT_THAT(used.Use("powersgd:rank=2", 2), IsOk());
  ASSERT_THAT(fresh.Use("powersgd:rank=2", 2), IsOk());
  for (int round = 0; round < 3; ++round) {
    ASSERT_THAT(
        EncodeFlatToBundle(TwoMatrices(), Ramp(256, 1.0f + round), used, {}, nullptr, {true, true})
            .status(),
        IsOk());
  }
  const std::vector<float> x = Ramp(256, 0.75f);
  auto a = EncodeFlatToBundle(TwoMatrices(), x, used, {}, nullptr);
  auto b = EncodeFlatToBundle(TwoMatrices(), x, fresh, {}, nullptr);
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
}

TEST(Bundle, ValuesShorterThanTheLayoutAreRefused) {
  auto registry = NewBuiltinCodecRegistry();
  TensorCodecs codecs(registry.get());
  ASSERT_THAT(codecs.Use("none", 2), IsOk());
  const std::vector<float> x(200, 1.0f);
  EXPECT_THAT(FlatToBundle(TwoMatrices(), x).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(EncodeFlatToBundle(TwoMatrices(), x, codecs, {}, nullptr, {false, true}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(EncodeFlatToBundle(TwoMatrices(), x, codecs, {}, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
