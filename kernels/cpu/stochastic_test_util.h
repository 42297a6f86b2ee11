// Helpers for statistical tests of stochastic codecs: decode many independent encodings.
#ifndef TERN_KERNELS_CPU_STOCHASTIC_TEST_UTIL_H_
#define TERN_KERNELS_CPU_STOCHASTIC_TEST_UTIL_H_

#include <vector>

#include "gtest/gtest.h"
#include "kernels/codec.h"

namespace tern::testing {

struct Moments {
  std::vector<double> mean;    // per element E[D(C(x))]
  std::vector<double> second;  // per element E[D(C(x))^2]
  double mean_sq_error = 0;    // E ||D(C(x)) - x||^2
  double mean_bits = 0;        // E[payload + scale bits]
};

inline Moments DecodeMoments(Codec& codec, const std::vector<float>& x, int trials) {
  Moments m;
  m.mean.assign(x.size(), 0);
  m.second.assign(x.size(), 0);
  std::vector<float> y(x.size());
  for (int t = 0; t < trials; ++t) {
    EncodedTensor enc;
    EncodeOptions o;
    o.seed = 0x5eed0000u + t;
    EXPECT_TRUE(codec.Encode(x, o, &enc).ok());
    EXPECT_TRUE(codec.Decode(EncodedView::Of(enc), absl::MakeSpan(y)).ok());
    m.mean_bits += 8.0 * enc.ByteSize() / trials;
    for (size_t i = 0; i < x.size(); ++i) {
      m.mean[i] += double(y[i]) / trials;
      m.second[i] += double(y[i]) * y[i] / trials;
      m.mean_sq_error += double(y[i] - x[i]) * (y[i] - x[i]) / trials;
    }
  }
  return m;
}

// Asserts |mean - x| <= z standard errors, using the observed per-element variance.
inline void ExpectUnbiased(const Moments& m, const std::vector<float>& x, int trials,
                           double z = 5.0) {
  for (size_t i = 0; i < x.size(); ++i) {
    const double var = std::max(0.0, m.second[i] - m.mean[i] * m.mean[i]);
    const double se = std::sqrt(var / trials) + 1e-6 * (1 + std::fabs(x[i]));
    ASSERT_LE(std::fabs(m.mean[i] - x[i]), z * se) << "element " << i << " x=" << x[i];
  }
}

}  // namespace tern::testing

#endif  // TERN_KERNELS_CPU_STOCHASTIC_TEST_UTIL_H_
