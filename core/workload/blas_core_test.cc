#include "core/workload/blas_core.h"

#include "gtest/gtest.h"

namespace tern {
namespace {

TEST(BlasCore, GenericKernelsOnAnAvx512CpuAreReplacedBySkylakeX) {
  EXPECT_EQ(BetterBlasCore("Prescott", {.avx2_fma = true, .avx512 = true}), "SkylakeX");
}

TEST(BlasCore, GenericKernelsOnAnAvx2CpuAreReplacedByHaswell) {
  EXPECT_EQ(BetterBlasCore("Prescott", {.avx2_fma = true, .avx512 = false}), "Haswell");
}

TEST(BlasCore, AKnownCpusOwnChoiceStands) {
  EXPECT_EQ(BetterBlasCore("Haswell", {.avx2_fma = true, .avx512 = true}), "");
  EXPECT_EQ(BetterBlasCore("Zen", {.avx2_fma = true, .avx512 = false}), "");
  EXPECT_EQ(BetterBlasCore("SkylakeX", {.avx2_fma = true, .avx512 = true}), "");
}

TEST(BlasCore, AnOldCpuKeepsTheGenericKernels) { EXPECT_EQ(BetterBlasCore("Prescott", {}), ""); }

TEST(BlasCore, TheLoadedLibraryNamesItsKernels) { EXPECT_FALSE(BlasCoreName().empty()); }

}  // namespace
}  // namespace tern
