#include "common/finite.h"

#include <cstdint>
#include <cstring>

#include "common/simd.h"

namespace tern {
namespace {

// A float is Inf or NaN exactly when its exponent bits are all ones. Integer compares ORed
// together vectorise where GCC leaves a float compare-and-OR scalar.
TERN_MULTIVERSION uint32_t NonFiniteBits(const uint32_t* __restrict bits, size_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= static_cast<uint32_t>((bits[i] & kExponent) == kExponent);
  return bad;
}

}  // namespace

bool AllFinite(absl::Span<const float> x) {
  static_assert(sizeof(float) == sizeof(uint32_t));
  // Floats read as their bits in place: the loop only looks at the representation.
  return NonFiniteBits(reinterpret_cast<const uint32_t*>(x.data()), x.size()) == 0;
}

}  // namespace tern
