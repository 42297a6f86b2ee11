#include "kernels/cpu/bf16.h"

#include <cstring>

#include "common/half.h"
#include "common/simd.h"
#include "kernels/cpu/cast_codec.h"

namespace tern {
namespace {

TERN_MULTIVERSION void EncodeBf16(const float* x, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = FloatToBfloat16(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

TERN_MULTIVERSION void DecodeBf16(const uint8_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = Bfloat16ToFloat(h);
  }
}

TERN_MULTIVERSION void AccumulateBf16(const uint8_t* in, float w, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] += w * Bfloat16ToFloat(h);
  }
}

struct Bf16Traits {
  static constexpr const format::CastFormat& kFormat = format::kBf16;
  static constexpr bool kLossless = false;
  static constexpr bool kWordsAreFloats = false;
  static void EncodeLoop(const float* x, uint8_t* out, size_t n) { EncodeBf16(x, out, n); }
  static void DecodeLoop(const uint8_t* in, float* out, size_t n) { DecodeBf16(in, out, n); }
  static void AccumulateLoop(const uint8_t* in, float w, float* out, size_t n) {
    AccumulateBf16(in, w, out, n);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewBf16Codec(SpecParams&) {
  return std::make_unique<internal::CastCodec<Bf16Traits>>();
}

}  // namespace tern
