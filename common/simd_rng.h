// The counter RNG (common/rng.h) on SIMD lanes, for codecs with hand-written AVX2 / AVX-512
// loops: lane j of a call for `first` is exactly Uniform01Lo(key, first + j), so every path gives
// the same bits. Include only from .cc files; the functions carry their own target attributes.
//
// Thread-safety: pure functions over immutable constants.
#ifndef TERN_COMMON_SIMD_RNG_H_
#define TERN_COMMON_SIMD_RNG_H_

#include "common/rng.h"
#include "common/simd.h"

#if defined(TERN_X86_DISPATCH)
#if defined(__clang__)
#include <immintrin.h>
#else
// GCC 12's AVX-512 intrinsics trip a false -Wmaybe-uninitialized (GCC PR 105593) when inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#define TERN_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,bmi2")))
#define TERN_TARGET_AVX2 __attribute__((target("avx2")))

namespace tern::internal {

// Broadcast key words and hash constants, built once per loop (plain structs: vector types lose
// their alignment attributes as template arguments).
struct LaneRng16 {
  __m512i k0, k1, m1, m2, lane;
};
struct LaneRng8 {
  __m256i k0, k1, m1, m2, lane;
};

TERN_TARGET_AVX512 inline LaneRng16 MakeLaneRng16(RngKey key) {
  return {_mm512_set1_epi32(static_cast<int>(key.k0)),
          _mm512_set1_epi32(static_cast<int>(Mix32(key.k1))), _mm512_set1_epi32(0x7feb352d),
          _mm512_set1_epi32(static_cast<int>(0x846ca68bU)),
          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)};
}

// Uniform01Lo(key, first + j) for j < 16.
// Random32Lo(key, first + lane) in 16 lanes.
TERN_TARGET_AVX512 inline __m512i Random16(const LaneRng16& c, uint32_t first) {
  __m512i r = _mm512_add_epi32(
      _mm512_xor_si512(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(first)), c.lane), c.k0),
      c.k1);
  r = _mm512_xor_si512(r, _mm512_srli_epi32(r, 16));
  r = _mm512_mullo_epi32(r, c.m1);
  r = _mm512_xor_si512(r, _mm512_srli_epi32(r, 15));
  r = _mm512_mullo_epi32(r, c.m2);
  r = _mm512_xor_si512(r, _mm512_srli_epi32(r, 16));
  return r;
}

// Uniform01Lo(key, first + lane) in 16 lanes.
TERN_TARGET_AVX512 inline __m512 Uniform16(const LaneRng16& c, uint32_t first) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(Random16(c, first), 8)),
                       _mm512_set1_ps(0x1p-24f));
}

TERN_TARGET_AVX2 inline LaneRng8 MakeLaneRng8(RngKey key) {
  return {_mm256_set1_epi32(static_cast<int>(key.k0)),
          _mm256_set1_epi32(static_cast<int>(Mix32(key.k1))), _mm256_set1_epi32(0x7feb352d),
          _mm256_set1_epi32(static_cast<int>(0x846ca68bU)),
          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)};
}

// Uniform01Lo(key, first + j) for j < 8.
TERN_TARGET_AVX2 inline __m256 Uniform8(const LaneRng8& c, uint32_t first) {
  __m256i r = _mm256_add_epi32(
      _mm256_xor_si256(_mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)), c.lane), c.k0),
      c.k1);
  r = _mm256_xor_si256(r, _mm256_srli_epi32(r, 16));
  r = _mm256_mullo_epi32(r, c.m1);
  r = _mm256_xor_si256(r, _mm256_srli_epi32(r, 15));
  r = _mm256_mullo_epi32(r, c.m2);
  r = _mm256_xor_si256(r, _mm256_srli_epi32(r, 16));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8)), _mm256_set1_ps(0x1p-24f));
}

}  // namespace tern::internal

#endif  // TERN_X86_DISPATCH
#endif  // TERN_COMMON_SIMD_RNG_H_
