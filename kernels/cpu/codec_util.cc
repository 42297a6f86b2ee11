#include "kernels/cpu/codec_util.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/rng.h"
#include "common/simd.h"
#include "common/simd_rng.h"

namespace tern::internal {
namespace {

constexpr size_t kMomentBlock = 4096;

TERN_MULTIVERSION float BlockSumSquares(const float* x, size_t n) {
  float acc[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j] * x[i + j];
  }
  float s = 0;
  for (; i < n; ++i) s += x[i] * x[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

TERN_MULTIVERSION float BlockSumAbs(const float* x, size_t n) {
  float acc[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += std::fabs(x[i + j]);
  }
  float s = 0;
  for (; i < n; ++i) s += std::fabs(x[i]);
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

// |x| compared as integers: for non-NaN floats the order of (bits & 0x7fffffff) is the order of
// |x|, and an integer max reduction vectorises where GCC leaves the float one scalar (and GCC 12
// only vectorises it for signed ints). NaNs count as 0.
inline int32_t AbsBits(float f) {
  const int32_t a = std::bit_cast<int32_t>(f) & 0x7fffffff;
  return a > 0x7f800000 ? 0 : a;
}

TERN_MULTIVERSION float BlockMaxAbs(const float* x, size_t n) {
  int32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, AbsBits(x[i]));
  return std::bit_cast<float>(m);
}

#if defined(TERN_X86_DISPATCH)
__attribute__((target("avx2"))) void PackSignBitsAvx2(const float* x, size_t n, uint8_t* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    out[i / 8] = static_cast<uint8_t>(_mm256_movemask_ps(_mm256_loadu_ps(x + i)));
  }
  if (i < n) {
    unsigned b = 0;
    for (size_t j = 0; i + j < n; ++j) b |= (std::bit_cast<uint32_t>(x[i + j]) >> 31) << j;
    out[i / 8] = static_cast<uint8_t>(b);
  }
}
#endif

void PackSignBitsGeneric(const float* x, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; i += 8) {
    unsigned b = 0;
    for (size_t j = 0; j < 8 && i + j < n; ++j) b |= (std::bit_cast<uint32_t>(x[i + j]) >> 31) << j;
    out[i / 8] = static_cast<uint8_t>(b);
  }
}

// One block's sum, sum of squares and max |x|, 16 lanes each.
TERN_MULTIVERSION float BlockSum(const float* x, size_t n) {
  float acc[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j];
  }
  float s = 0;
  for (; i < n; ++i) s += x[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

#if defined(TERN_X86_DISPATCH)
// BlockSum, BlockSumSquares and BlockMaxAbs in one pass, adding in exactly their order (16 lane
// accumulators, then the tail, then the lanes in order), so the result is bit-identical.
__attribute__((target("avx2"))) void BlockMomentsAvx2(const float* x, size_t n, float* sum,
                                                      float* sum_sq, float* max_abs) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, q0 = s0, q1 = s0;
  __m256i m = _mm256_setzero_si256();
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i + 512), _MM_HINT_T0);
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
    q0 = _mm256_add_ps(q0, _mm256_mul_ps(a, a));
    q1 = _mm256_add_ps(q1, _mm256_mul_ps(b, b));
    // AbsBits on 8 lanes: |bits|, zeroed where NaN.
    const __m256i ia = _mm256_and_si256(_mm256_castps_si256(a), abs_mask);
    const __m256i ib = _mm256_and_si256(_mm256_castps_si256(b), abs_mask);
    m = _mm256_max_epi32(m, _mm256_andnot_si256(_mm256_cmpgt_epi32(ia, inf), ia));
    m = _mm256_max_epi32(m, _mm256_andnot_si256(_mm256_cmpgt_epi32(ib, inf), ib));
  }
  alignas(32) float s[16], q[16];
  alignas(32) int32_t ms[8];
  _mm256_store_ps(s, s0);
  _mm256_store_ps(s + 8, s1);
  _mm256_store_ps(q, q0);
  _mm256_store_ps(q + 8, q1);
  _mm256_store_si256(reinterpret_cast<__m256i*>(ms), m);
  float ts = 0, tq = 0;
  int32_t tm = 0;
  for (; i < n; ++i) {
    ts += x[i];
    tq += x[i] * x[i];
    tm = std::max(tm, AbsBits(x[i]));
  }
  for (int j = 0; j < 16; ++j) {
    ts += s[j];
    tq += q[j];
  }
  for (int j = 0; j < 8; ++j) tm = std::max(tm, ms[j]);
  *sum = ts;
  *sum_sq = tq;
  *max_abs = std::bit_cast<float>(tm);
}
#endif

void BlockMoments(const float* x, size_t n, float* sum, float* sum_sq, float* max_abs) {
#if defined(TERN_X86_DISPATCH)
  if (CpuHasAvx2F16c()) return BlockMomentsAvx2(x, n, sum, sum_sq, max_abs);
#endif
  // Three passes over the L1-resident block: GCC vectorises each loop alone cleanly, but turns
  // one loop with all three reductions into lane shuffles that run 4x slower.
  *sum = BlockSum(x, n);
  *sum_sq = BlockSumSquares(x, n);
  *max_abs = BlockMaxAbs(x, n);
}

// out = ±value (kAdd: out += ±value), minus where the sign bit is set. A table lookup per sign
// byte turns the bit unpacking into 8-lane ops that vectorise.
template <bool kAdd>
TERN_MULTIVERSION void SignedLoop(const uint8_t* signs, size_t n, float value, float* out) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint32_t* m = kSignMasks.m[signs[i / 8]];
    for (int j = 0; j < 8; ++j) {
      if constexpr (kAdd) {
        out[i + j] += std::bit_cast<float>(bits ^ m[j]);
      } else {
        out[i + j] = std::bit_cast<float>(bits ^ m[j]);
      }
    }
  }
  for (; i < n; ++i) {
    const float v = std::bit_cast<float>(bits ^ kSignMasks.m[signs[i / 8]][i % 8]);
    if constexpr (kAdd) {
      out[i] += v;
    } else {
      out[i] = v;
    }
  }
}

#if defined(TERN_X86_DISPATCH)
// Sixteen values a step: two sign bytes are the lanes' blend mask (bit j of byte b is value
// 8 b + j, lane for lane), choosing value or -value, with no table. The same values as the loop
// above, so the same bits; the tail by it.
template <bool kAdd>
TERN_TARGET_AVX512 void SignedAvx512(const uint8_t* signs, size_t n, float value, float* out) {
  const __m512 plus = _mm512_set1_ps(value);
  const __m512 minus = _mm512_set1_ps(-value);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint16_t k;
    std::memcpy(&k, signs + i / 8, sizeof k);
    __m512 v = _mm512_mask_blend_ps(k, plus, minus);
    if constexpr (kAdd) v = _mm512_add_ps(_mm512_loadu_ps(out + i), v);
    _mm512_storeu_ps(out + i, v);
  }
  SignedLoop<kAdd>(signs + i / 8, n - i, value, out + i);
}
#endif

template <bool kAdd>
void Signed(const uint8_t* signs, size_t n, float value, float* out) {
#if defined(TERN_X86_DISPATCH)
  if (CpuHasAvx512()) return SignedAvx512<kAdd>(signs, n, value, out);
#endif
  SignedLoop<kAdd>(signs, n, value, out);
}

TERN_MULTIVERSION void AddScaledLoop(const float* v, size_t n, float w, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] += w * v[i];
}

TERN_MULTIVERSION void FillUniformLoop(RngKey key, uint32_t first, uint32_t n, float* u) {
  for (uint32_t i = 0; i < n; ++i) u[i] = Uniform01Lo(key, first + i);
}

#if defined(TERN_X86_DISPATCH)
// Uniform01Lo on 16 lanes; the same integer and float steps, so the same bits.
TERN_TARGET_AVX512 void FillUniformAvx512(RngKey key, uint32_t first, uint32_t n, float* u) {
  const LaneRng16 rng = MakeLaneRng16(key);
  uint32_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(u + i, Uniform16(rng, first + i));
  for (; i < n; ++i) u[i] = Uniform01Lo(key, first + i);
}
#endif

}  // namespace

void FillUniform01(RngKey key, uint32_t first, uint32_t n, float* u) {
#if defined(TERN_X86_DISPATCH)
  if (CpuHasAvx512()) return FillUniformAvx512(key, first, n, u);
#endif
  FillUniformLoop(key, first, n, u);
}

void FillSigned(const uint8_t* signs, size_t n, float value, float* out) {
  Signed<false>(signs, n, value, out);
}

void AddSigned(const uint8_t* signs, size_t n, float value, float* out) {
  Signed<true>(signs, n, value, out);
}

void AddScaled(const float* v, size_t n, float w, float* out) { AddScaledLoop(v, n, w, out); }

Moments ComputeMoments(absl::Span<const float> x) {
  Moments m;
  for (size_t i = 0; i < x.size(); i += kMomentBlock) {
    float s, q, a;
    BlockMoments(x.data() + i, std::min(kMomentBlock, x.size() - i), &s, &q, &a);
    m.sum += s;
    m.sum_squares += q;
    m.max_abs = std::max(m.max_abs, a);
  }
  return m;
}

void PackSignBits(const float* x, size_t n, uint8_t* out) {
#if defined(TERN_X86_DISPATCH)
  if (CpuHasAvx2F16c()) return PackSignBitsAvx2(x, n, out);
#endif
  PackSignBitsGeneric(x, n, out);
}

double SumSquares(absl::Span<const float> x) {
  double s = 0;
  for (size_t i = 0; i < x.size(); i += kMomentBlock) {
    s += BlockSumSquares(x.data() + i, std::min(kMomentBlock, x.size() - i));
  }
  return s;
}

double SumAbs(absl::Span<const float> x) {
  double s = 0;
  for (size_t i = 0; i < x.size(); i += kMomentBlock) {
    s += BlockSumAbs(x.data() + i, std::min(kMomentBlock, x.size() - i));
  }
  return s;
}

float MaxAbs(absl::Span<const float> x) { return BlockMaxAbs(x.data(), x.size()); }

absl::Status CheckSelection(const Codec& codec, const TopKSelection& selection) {
  if (absl::Status s = CheckNumel(codec.Name(), selection.numel); !s.ok()) return s;
  const size_t k = codec.TopK(selection.numel);
  if (selection.indices.size() != k || selection.values.size() != k) {
    return absl::InvalidArgumentError(absl::StrCat(
        codec.Name(), ": a selection of ", selection.indices.size(), " indices and ",
        selection.values.size(), " values for ", selection.numel, " elements, expected ", k));
  }
  int64_t prev = -1;
  for (uint32_t i : selection.indices) {
    if (static_cast<int64_t>(i) <= prev || i >= selection.numel) {
      return absl::InvalidArgumentError(
          absl::StrCat(codec.Name(), ": selected index ", i, " is out of order or out of range"));
    }
    prev = i;
  }
  return absl::OkStatus();
}

}  // namespace tern::internal
