#include "kernels/format/cast.h"

#include <cstring>

#include "common/simd.h"
#include "kernels/format/payload.h"

namespace tern::format {

absl::Status CheckCastPayload(const CastFormat& f, const EncodedView& in) {
  if (!in.scales.empty()) return internal::PayloadError(f.name, "expected no scales");
  if (in.payload.size() != in.numel * f.word_bytes) {
    return internal::PayloadError(f.name, "expected ", in.numel * f.word_bytes, " bytes for ",
                                  in.numel, " elements, got ", in.payload.size());
  }
  return absl::OkStatus();
}

namespace {

// The smallest (word & mask) ^ mask over the words: zero iff some word has every exponent bit
// set (Inf or NaN). A min reduction vectorises (vpminud / vpminuw), where an early exit or an
// OR of comparisons stays scalar and would cost more than the decode itself.
TERN_MULTIVERSION uint32_t MinMasked32(const uint8_t* p, size_t n, uint32_t mask) {
  uint32_t lo = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    uint32_t w;
    std::memcpy(&w, p + 4 * i, 4);
    const uint32_t d = (w & mask) ^ mask;
    lo = d < lo ? d : lo;
  }
  return lo;
}

TERN_MULTIVERSION uint32_t MinMasked16(const uint8_t* p, size_t n, uint16_t mask) {
  uint16_t lo = 0xffff;
  for (size_t i = 0; i < n; ++i) {
    uint16_t w;
    std::memcpy(&w, p + 2 * i, 2);
    const uint16_t d = static_cast<uint16_t>((w & mask) ^ mask);
    lo = d < lo ? d : lo;
  }
  return lo;
}

}  // namespace

absl::Status CheckCastFinite(const CastFormat& f, const EncodedView& in) {
  const bool finite =
      in.numel == 0 ||
      (f.word_bytes == 4
           ? MinMasked32(in.payload.data(), in.numel, f.exponent_mask)
           : MinMasked16(in.payload.data(), in.numel, static_cast<uint16_t>(f.exponent_mask))) != 0;
  if (!finite) return internal::PayloadError(f.name, "holds Inf or NaN");
  return absl::OkStatus();
}

}  // namespace tern::format
