#include "kernels/dgc_memory.h"

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

TEST(DgcMemory, WarmUpDecaysFrom25PercentToTheTargetLikeThePaper) {
  DgcOptions o;
  o.ratio = 0.001;
  o.warmup_epochs = 4;
  auto m = DgcMemory::Create(o);
  ASSERT_THAT(m, IsOk());
  const double want[] = {0.25, 0.0629, 0.0158, 0.00397, 0.001, 0.001};
  for (int e = 0; e <= 5; ++e) {
    (*m)->SetEpoch(e);
    EXPECT_NEAR((*m)->CurrentRatio(), want[e], 0.01 * want[e]) << "epoch " << e;
  }
}

TEST(DgcMemory, MasksSentCoordinatesAndAccumulatesTheRest) {
  DgcOptions o;
  o.ratio = 0.01;
  o.momentum = 0.9;
  o.warmup_epochs = 0;
  o.exact_topk = true;
  auto m = DgcMemory::Create(o);
  ASSERT_THAT(m, IsOk());
  auto registry = NewBuiltinCodecRegistry();
  const size_t d = 10000;
  std::vector<float> u(d, 0.0f), v(d, 0.0f), y(d);
  for (int step = 0; step < 5; ++step) {
    const auto g = testing::Gaussian(d, 300 + step);
    for (size_t i = 0; i < d; ++i) {  // reference: u = m u + g; v = v + u
      u[i] = 0.9f * u[i] + g[i];
      v[i] += u[i];
    }
    EncodedTensor enc;
    ASSERT_THAT((*m)->Encode(g, {}, &enc), IsOk());
    ASSERT_THAT(registry->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
    size_t sent = 0;
    for (size_t i = 0; i < d; ++i) {
      if (y[i] != 0) {
        ++sent;
        ASSERT_NEAR(y[i], v[i], 1e-4f * (1 + std::fabs(v[i])));  // sends the accumulated value
        u[i] = v[i] = 0;                                         // factor masking
      }
      ASSERT_NEAR((*m)->accumulated()[i], v[i], 1e-4f * (1 + std::fabs(v[i])));
      ASSERT_NEAR((*m)->momentum()[i], u[i], 1e-4f * (1 + std::fabs(u[i])));
    }
    EXPECT_EQ(sent, 100u);
  }
}

TEST(DgcMemory, ClipsTheGradientAtTheScaledNorm) {
  DgcOptions o;
  o.ratio = 1.0;
  o.momentum = 0;
  o.clip_norm = 2.0;
  o.num_workers = 4;  // local limit 2 / sqrt(4) = 1
  o.warmup_epochs = 0;
  o.exact_topk = true;
  auto m = DgcMemory::Create(o);
  ASSERT_THAT(m, IsOk());
  const std::vector<float> g = {3.0f, 4.0f};  // norm 5 -> scaled to norm 1
  EncodedTensor enc;
  ASSERT_THAT((*m)->Encode(g, {}, &enc), IsOk());
  std::vector<float> y(2);
  ASSERT_THAT(NewBuiltinCodecRegistry()->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  EXPECT_NEAR(y[0], 0.6f, 1e-6f);
  EXPECT_NEAR(y[1], 0.8f, 1e-6f);
}

TEST(DgcMemory, RejectsBadOptions) {
  DgcOptions o;
  o.ratio = 0;
  EXPECT_THAT(DgcMemory::Create(o), StatusIs(absl::StatusCode::kInvalidArgument));
  o.ratio = 0.1;
  o.momentum = 1.0;
  EXPECT_THAT(DgcMemory::Create(o), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
