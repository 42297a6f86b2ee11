#include "kernels/error_feedback.h"

#include <cmath>
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

// Sum over steps of what was sent, plus the final residual, equals the sum of the inputs: error
// feedback loses nothing, it only delays.
TEST(ErrorFeedback, ConservesMassForEveryLossyCodec) {
  auto registry = NewBuiltinCodecRegistry();
  for (const char* spec : {"topk:ratio=0.01", "sign", "stc:ratio=0.05", "randomk:ratio=0.1",
                           "terngrad", "qsgd:levels=4", "int8", "dgc:ratio=0.02"}) {
    auto codec = registry->Create(spec);
    ASSERT_THAT(codec, IsOk());
    ErrorFeedback ef(std::move(*codec));
    const size_t d = 3000;
    // `scale` bounds the magnitudes that went through float arithmetic, for the rounding tolerance.
    std::vector<double> in(d, 0.0), sent(d, 0.0), scale(d, 0.0);
    std::vector<float> y(d);
    for (int step = 0; step < 30; ++step) {
      const auto g = testing::Gaussian(d, 200 + step);
      EncodedTensor enc;
      EncodeOptions o;
      o.seed = step;
      ASSERT_THAT(ef.Encode(g, o, &enc), IsOk());
      ASSERT_THAT(ef.codec().Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
      for (size_t i = 0; i < d; ++i) {
        in[i] += g[i];
        sent[i] += y[i];
        scale[i] += std::fabs(y[i]) + std::fabs(g[i]) + std::fabs(ef.residual()[i]);
      }
    }
    for (size_t i = 0; i < d; ++i) {
      ASSERT_NEAR(sent[i] + ef.residual()[i], in[i], 1e-6 * (1 + scale[i]))
          << spec << " element " << i;
    }
  }
}

TEST(ErrorFeedback, RejectsATensorOfAnotherSize) {
  auto codec = NewBuiltinCodecRegistry()->Create("sign");
  ASSERT_THAT(codec, IsOk());
  ErrorFeedback ef(std::move(*codec));
  EncodedTensor enc;
  ASSERT_THAT(ef.Encode(testing::Gaussian(10, 1), {}, &enc), IsOk());
  EXPECT_THAT(ef.Encode(testing::Gaussian(11, 1), {}, &enc),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
