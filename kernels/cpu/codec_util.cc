#include "kernels/cpu/codec_util.h"

#include <algorithm>
#include <bit>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/simd.h"

namespace tern::internal {
namespace {

constexpr size_t kBlock = 4096;

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

TERN_MULTIVERSION float BlockMaxAbs(const float* x, size_t n) {
  float acc[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] = std::max(acc[j], std::fabs(x[i + j]));
  }
  float m = 0;
  for (; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  for (int j = 0; j < 16; ++j) m = std::max(m, acc[j]);
  return m;
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
TERN_MULTIVERSION void BlockMoments(const float* x, size_t n, float* sum, float* sum_sq,
                                    float* max_abs) {
  float s[16] = {}, q[16] = {}, m[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) {
      s[j] += x[i + j];
      q[j] += x[i + j] * x[i + j];
      m[j] = std::max(m[j], std::fabs(x[i + j]));
    }
  }
  float ts = 0, tq = 0, tm = 0;
  for (; i < n; ++i) {
    ts += x[i];
    tq += x[i] * x[i];
    tm = std::max(tm, std::fabs(x[i]));
  }
  for (int j = 0; j < 16; ++j) {
    ts += s[j];
    tq += q[j];
    tm = std::max(tm, m[j]);
  }
  *sum = ts;
  *sum_sq = tq;
  *max_abs = tm;
}

struct SignMasks {
  uint32_t m[256][8];  // m[byte][j] = bit j of byte, moved to the f32 sign position
};
constexpr SignMasks MakeSignMasks() {
  SignMasks t{};
  for (int b = 0; b < 256; ++b) {
    for (int j = 0; j < 8; ++j) t.m[b][j] = static_cast<uint32_t>((b >> j) & 1) << 31;
  }
  return t;
}
constexpr SignMasks kSignMasks = MakeSignMasks();

// A table lookup per sign byte turns the bit unpacking into 8-lane XORs that vectorise.
TERN_MULTIVERSION void ApplySignBitsLoop(const uint8_t* signs, size_t n, float* v) {
  auto flip = [](float f, uint32_t mask) {
    return std::bit_cast<float>(std::bit_cast<uint32_t>(f) ^ mask);
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint32_t* m = kSignMasks.m[signs[i / 8]];
    for (int j = 0; j < 8; ++j) v[i + j] = flip(v[i + j], m[j]);
  }
  for (; i < n; ++i) v[i] = flip(v[i], kSignMasks.m[signs[i / 8]][i % 8]);
}

TERN_MULTIVERSION void FillSignedLoop(const uint8_t* signs, size_t n, float value, float* out) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint32_t* m = kSignMasks.m[signs[i / 8]];
    for (int j = 0; j < 8; ++j) out[i + j] = std::bit_cast<float>(bits ^ m[j]);
  }
  for (; i < n; ++i) out[i] = std::bit_cast<float>(bits ^ kSignMasks.m[signs[i / 8]][i % 8]);
}

TERN_MULTIVERSION void AddScaledLoop(const float* v, size_t n, float w, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] += w * v[i];
}

}  // namespace

void ApplySignBits(const uint8_t* signs, size_t n, float* v) { ApplySignBitsLoop(signs, n, v); }

void FillSigned(const uint8_t* signs, size_t n, float value, float* out) {
  FillSignedLoop(signs, n, value, out);
}

void AddScaled(const float* v, size_t n, float w, float* out) { AddScaledLoop(v, n, w, out); }

Moments ComputeMoments(absl::Span<const float> x) {
  Moments m;
  for (size_t i = 0; i < x.size(); i += kBlock) {
    float s, q, a;
    BlockMoments(x.data() + i, std::min(kBlock, x.size() - i), &s, &q, &a);
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

double SumSquares(absl::Span<const float> x) {
  double s = 0;
  for (size_t i = 0; i < x.size(); i += kBlock) {
    s += BlockSumSquares(x.data() + i, std::min(kBlock, x.size() - i));
  }
  return s;
}

double SumAbs(absl::Span<const float> x) {
  double s = 0;
  for (size_t i = 0; i < x.size(); i += kBlock) {
    s += BlockSumAbs(x.data() + i, std::min(kBlock, x.size() - i));
  }
  return s;
}

float MaxAbs(absl::Span<const float> x) { return BlockMaxAbs(x.data(), x.size()); }

}  // namespace tern::internal
