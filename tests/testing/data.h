// Deterministic test data: Gaussian vectors from the counter-based generator.
#ifndef TERN_TESTS_TESTING_DATA_H_
#define TERN_TESTS_TESTING_DATA_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/rng.h"

namespace tern::testing {

// n samples of N(mean, sigma^2), reproducible from `seed`.
inline std::vector<float> Gaussian(size_t n, uint64_t seed, float sigma = 1.0f, float mean = 0.0f) {
  std::vector<float> x(n);
  const RngKey key = MakeRngKey(seed, 0x7e57);
  for (size_t i = 0; i < n; ++i) x[i] = mean + sigma * Normal(key, i);
  return x;
}

}  // namespace tern::testing

#endif  // TERN_TESTS_TESTING_DATA_H_
