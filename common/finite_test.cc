#include "common/finite.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tern {
namespace {

TEST(AllFinite, TakesFiniteValuesUpToTheLargestAndSubnormals) {
  std::vector<float> x(1003, 1.5f);
  x[3] = std::numeric_limits<float>::max();
  x[7] = -std::numeric_limits<float>::max();
  x[11] = std::numeric_limits<float>::denorm_min();
  x[12] = -0.0f;
  EXPECT_TRUE(AllFinite(x));
  EXPECT_TRUE(AllFinite({}));
}

TEST(AllFinite, FindsOneInfOrNanAnywhere) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), -std::nanf("")}) {
    // Every position of a length that is not a multiple of any vector width.
    for (size_t at = 0; at < 37; ++at) {
      std::vector<float> x(37, -2.0f);
      x[at] = bad;
      EXPECT_FALSE(AllFinite(x)) << bad << " at " << at;
    }
  }
}

}  // namespace
}  // namespace tern
