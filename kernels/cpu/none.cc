#include "kernels/cpu/none.h"

#include <cstring>

#include "common/simd.h"
#include "kernels/cpu/cast_codec.h"

namespace tern {
namespace {

TERN_MULTIVERSION void AccumulateF32(const uint8_t* in, float w, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, in + 4 * i, 4);
    out[i] += w * v;
  }
}

struct NoneTraits {
  static constexpr const format::CastFormat& kFormat = format::kNone;
  static constexpr bool kLossless = true;
  static constexpr bool kWordsAreFloats = true;
  static void EncodeLoop(const float* x, uint8_t* out, size_t n) { std::memcpy(out, x, 4 * n); }
  static void DecodeLoop(const uint8_t* in, float* out, size_t n) { std::memcpy(out, in, 4 * n); }
  static void AccumulateLoop(const uint8_t* in, float w, float* out, size_t n) {
    AccumulateF32(in, w, out, n);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewNoneCodec(SpecParams&) {
  return std::make_unique<internal::CastCodec<NoneTraits>>();
}

}  // namespace tern
