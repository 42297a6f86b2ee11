#include "kernels/format/payload.h"

#include <cmath>
#include <cstring>

namespace tern::internal {

absl::Status CheckScales(absl::string_view codec, const EncodedView& in, size_t count,
                         bool signed_ok) {
  if (in.scales.size() != count) {
    return PayloadError(codec, "expected ", count, " scales, got ", in.scales.size());
  }
  for (size_t i = 0; i < count; ++i) {
    const float s = in.scales[i];
    if (!std::isfinite(s) || (!signed_ok && s < 0)) {
      return PayloadError(codec, "scale ", i, " is ", s, " (must be finite",
                          signed_ok ? "" : " and >= 0", ")");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckF32Values(absl::string_view codec, const uint8_t* p, size_t n, float bound) {
  bool bad = false;
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    bad |= !(std::abs(v) <= bound);  // NaN fails the comparison too
  }
  if (bad) return PayloadError(codec, "holds Inf, NaN or values beyond ", bound);
  return absl::OkStatus();
}

bool PaddingIsZero(const uint8_t* p, size_t bytes, size_t bits_used) {
  const size_t rem = bits_used % 8;
  return bytes == 0 || rem == 0 || (p[bytes - 1] >> rem) == 0;
}

}  // namespace tern::internal
