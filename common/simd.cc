#include "common/simd.h"

#include <cstdlib>
#include <cstring>

namespace tern {

SimdLevel SimdCap() {
  static const SimdLevel cap = [] {
    const char* v = std::getenv("TERN_SIMD");
    if (v == nullptr) return SimdLevel::kAvx512;
    if (std::strcmp(v, "none") == 0) return SimdLevel::kNone;
    if (std::strcmp(v, "avx2") == 0) return SimdLevel::kAvx2;
    return SimdLevel::kAvx512;
  }();
  return cap;
}

}  // namespace tern
