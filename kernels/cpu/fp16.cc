#include "kernels/cpu/fp16.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/half.h"
#include "common/simd.h"
#include "kernels/cpu/cast_codec.h"

namespace tern {
namespace {

#if defined(TERN_X86_DISPATCH)
// F16C's conversions round to nearest even like FloatToHalf/HalfToFloat, bit for bit.
__attribute__((target("avx2,f16c"))) void EncodeF16c(const float* x, uint8_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  for (; i < n; ++i) {
    const uint16_t h = FloatToHalf(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

template <bool kAccumulate>
__attribute__((target("avx2,f16c"))) void DecodeF16c(const uint8_t* in, float w, float* out,
                                                     size_t n) {
  size_t i = 0;
  const __m256 wv = _mm256_set1_ps(w);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
    if constexpr (kAccumulate) {
      _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(wv, v)));
    } else {
      _mm256_storeu_ps(out + i, v);
    }
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = kAccumulate ? out[i] + w * HalfToFloat(h) : HalfToFloat(h);
  }
}
#endif

void EncodeFp16Generic(const float* x, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = FloatToHalf(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void DecodeFp16Generic(const uint8_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = HalfToFloat(h);
  }
}

void AccumulateFp16Generic(const uint8_t* in, float w, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] += w * HalfToFloat(h);
  }
}

void EncodeFp16(const float* x, uint8_t* out, size_t n) {
#if defined(TERN_X86_DISPATCH)
  if (CpuHasAvx2F16c()) return EncodeF16c(x, out, n);
#endif
  EncodeFp16Generic(x, out, n);
}

void DecodeFp16(const uint8_t* in, float* out, size_t n) {
#if defined(TERN_X86_DISPATCH)
  if (CpuHasAvx2F16c()) return DecodeF16c<false>(in, 1.0f, out, n);
#endif
  DecodeFp16Generic(in, out, n);
}

void AccumulateFp16(const uint8_t* in, float w, float* out, size_t n) {
#if defined(TERN_X86_DISPATCH)
  if (CpuHasAvx2F16c()) return DecodeF16c<true>(in, w, out, n);
#endif
  AccumulateFp16Generic(in, w, out, n);
}

struct Fp16Traits {
  static constexpr const format::CastFormat& kFormat = format::kFp16;
  static constexpr bool kLossless = false;
  static constexpr bool kWordsAreFloats = false;
  static void EncodeLoop(const float* x, uint8_t* out, size_t n) { EncodeFp16(x, out, n); }
  static void DecodeLoop(const uint8_t* in, float* out, size_t n) { DecodeFp16(in, out, n); }
  static void AccumulateLoop(const uint8_t* in, float w, float* out, size_t n) {
    AccumulateFp16(in, w, out, n);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewFp16Codec(SpecParams&) {
  return std::make_unique<internal::CastCodec<Fp16Traits>>();
}

}  // namespace tern
