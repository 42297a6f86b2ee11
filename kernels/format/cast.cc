#include "kernels/format/cast.h"

#include <cstring>

#include "common/simd.h"
#include "kernels/format/payload.h"

namespace tern::format {

absl::Status CheckCastPayload(const CastFormat& f, const EncodedView& in) {
  if (!in.scales.empty()) return internal::PayloadError(f.name, "expected no scales");
  if (in.PayloadSize() != in.numel * f.word_bytes) {
    return internal::PayloadError(f.name, "expected ", in.numel * f.word_bytes, " bytes for ",
                                  in.numel, " elements, got ", in.PayloadSize());
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
  bool finite = true;
  const auto check = [&f, &finite](const uint8_t* words, size_t, size_t n) {
    finite = finite && (f.word_bytes == 4
                            ? MinMasked32(words, n, f.exponent_mask)
                            : MinMasked16(words, n, static_cast<uint16_t>(f.exponent_mask))) != 0;
  };
  if (in.pieces.empty()) {
    if (in.numel > 0) check(in.payload.data(), 0, in.numel);
  } else {
    ForEachWordRun(in.pieces, f.word_bytes, check);
  }
  if (!finite) return internal::PayloadError(f.name, "holds Inf or NaN");
  return absl::OkStatus();
}

}  // namespace tern::format
