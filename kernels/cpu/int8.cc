#include "kernels/cpu/int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/rng.h"
#include "common/simd.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "kernels/cpu/codec_util.h"
#include "common/simd_rng.h"
#include "kernels/format/int8.h"

namespace tern {
namespace {

// Quantises one block: code = clamp(floor(x * inv + u)), u = 0.5 (nearest) or uniform draws.
template <bool kStochastic>
inline void QuantizeAbsMaxT(const float* x, size_t n, float inv, const float* u, uint8_t* q) {
  for (size_t i = 0; i < n; ++i) {
    const float v =
        std::max(-127.0f, std::min(127.0f, std::floor(x[i] * inv + (kStochastic ? u[i] : 0.5f))));
    q[i] = static_cast<uint8_t>(static_cast<int32_t>(v));
  }
}
template <bool kStochastic>
inline void QuantizeMinMaxT(const float* x, size_t n, float lo, float inv, const float* u,
                            uint8_t* q) {
  for (size_t i = 0; i < n; ++i) {
    const float v = std::max(
        0.0f, std::min(255.0f, std::floor((x[i] - lo) * inv + (kStochastic ? u[i] : 0.5f))));
    q[i] = static_cast<uint8_t>(static_cast<int32_t>(v));
  }
}
TERN_MULTIVERSION void QuantizeAbsMax(const float* x, size_t n, float inv, const float* u,
                                      uint8_t* q) {
  u == nullptr ? QuantizeAbsMaxT<false>(x, n, inv, u, q) : QuantizeAbsMaxT<true>(x, n, inv, u, q);
}
TERN_MULTIVERSION void QuantizeMinMax(const float* x, size_t n, float lo, float inv, const float* u,
                                      uint8_t* q) {
  u == nullptr ? QuantizeMinMaxT<false>(x, n, lo, inv, u, q)
               : QuantizeMinMaxT<true>(x, n, lo, inv, u, q);
}

TERN_MULTIVERSION void MinMax(const float* x, size_t n, float* lo, float* hi) {
  float a = x[0], b = x[0];
  for (size_t i = 0; i < n; ++i) {
    a = std::min(a, x[i]);
    b = std::max(b, x[i]);
  }
  *lo = a;
  *hi = b;
}

#if defined(TERN_X86_DISPATCH)
// Quantises 16 at a time, with stochastic draws made in-register (no uniforms buffer):
// code = clamp(floor((x - lo) * inv + u), kMin, kMax), u = 0.5 or the draw, bit-identical to
// QuantizeAbsMaxT / QuantizeMinMaxT (lo = 0 for absmax). `first` is the global index of x[0].
template <bool kMinMax, bool kStochastic>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,bmi2"))) void QuantizeAvx512(
    const float* x, size_t n, uint32_t first, RngKey key, float lo, float inv, uint8_t* q) {
  const internal::LaneRng16 rng = internal::MakeLaneRng16(key);
  const __m512 vlo = _mm512_set1_ps(lo), vinv = _mm512_set1_ps(inv);
  const __m512 vmin = _mm512_set1_ps(kMinMax ? 0.0f : -127.0f);
  const __m512 vmax = _mm512_set1_ps(kMinMax ? 255.0f : 127.0f);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    if constexpr (kMinMax) v = _mm512_sub_ps(v, vlo);
    v = _mm512_mul_ps(v, vinv);
    // Keep the product rounded to float before adding u, as the scalar loop does (built with
    // -ffp-contract=off, kernels/CMakeLists.txt); this stops a compiler fusing them regardless.
    asm("" : "+v"(v));
    v = _mm512_add_ps(v, kStochastic ? internal::Uniform16(rng, first + static_cast<uint32_t>(i))
                                     : _mm512_set1_ps(0.5f));
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    // min(v, max) returns max for NaN, like std::min(max, v) in the scalar loop.
    v = _mm512_max_ps(_mm512_min_ps(v, vmax), vmin);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                     _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v)));
  }
  if (i < n) {  // tail: the scalar loop (with its own draws)
    float u[16];
    if constexpr (kStochastic) {
      internal::FillUniform01(key, first + static_cast<uint32_t>(i), static_cast<uint32_t>(n - i),
                              u);
    }
    if constexpr (kMinMax) {
      QuantizeMinMaxT<kStochastic>(x + i, n - i, lo, inv, u, q + i);
    } else {
      QuantizeAbsMaxT<kStochastic>(x + i, n - i, inv, u, q + i);
    }
  }
}
#endif

#if defined(TERN_X86_DISPATCH)
// MinMax 16 lanes at a time: min_ps(x, a) is x < a ? x : a, exactly std::min(a, x), so NaNs are
// skipped the same way and the result is identical (min and max are exact in any order).
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,bmi2"))) void MinMaxAvx512(const float* x,
                                                                                     size_t n,
                                                                                     float* lo,
                                                                                     float* hi) {
  __m512 a = _mm512_set1_ps(x[0]), b = a;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    a = _mm512_min_ps(v, a);
    b = _mm512_max_ps(v, b);
  }
  float la[16], lb[16];
  _mm512_storeu_ps(la, a);
  _mm512_storeu_ps(lb, b);
  float l = x[0], h = x[0];
  for (int j = 0; j < 16; ++j) {
    l = std::min(l, la[j]);
    h = std::max(h, lb[j]);
  }
  for (; i < n; ++i) {
    l = std::min(l, x[i]);
    h = std::max(h, x[i]);
  }
  *lo = l;
  *hi = h;
}
#endif

template <bool kAccumulate>
inline void DequantizeAbsMaxT(const uint8_t* q, size_t n, float scale, float w, float* out) {
  for (size_t i = 0; i < n; ++i) {
    internal::Store<kAccumulate>(out, i, static_cast<float>(static_cast<int8_t>(q[i])) * scale, w);
  }
}
template <bool kAccumulate>
inline void DequantizeMinMaxT(const uint8_t* q, size_t n, float lo, float step, float w,
                              float* out) {
  for (size_t i = 0; i < n; ++i) {
    internal::Store<kAccumulate>(out, i, lo + static_cast<float>(q[i]) * step, w);
  }
}
TERN_MULTIVERSION void DequantizeAbsMax(bool accumulate, const uint8_t* q, size_t n, float scale,
                                        float w, float* out) {
  accumulate ? DequantizeAbsMaxT<true>(q, n, scale, w, out)
             : DequantizeAbsMaxT<false>(q, n, scale, w, out);
}
TERN_MULTIVERSION void DequantizeMinMax(bool accumulate, const uint8_t* q, size_t n, float lo,
                                        float step, float w, float* out) {
  accumulate ? DequantizeMinMaxT<true>(q, n, lo, step, w, out)
             : DequantizeMinMaxT<false>(q, n, lo, step, w, out);
}

class Int8Codec final : public Codec {
 public:
  explicit Int8Codec(const format::Int8Params& p) : format_(p), params_(p.Canonical()) {}
  absl::string_view Name() const override { return format::kInt8Name; }
  std::string Spec() const override { return format_.Spec(); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    const size_t nb = (x.size() + format_.block - 1) / format_.block;
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.resize(format_.minmax ? 2 * nb : nb);
    uint8_t* p = internal::ResizePayload(&out->payload, format::kInt8HeaderBytes + x.size());
    format::WriteInt8Header(format_, p);
    uint8_t* q = p + format::kInt8HeaderBytes;
    const RngKey key = MakeRngKey(options.seed);
    float* scales = out->scales.data();
    ParallelFor(options.pool, nb, std::max<size_t>(1, (size_t{1} << 16) / format_.block), 1,
                [&](size_t b0, size_t b1) {
#if defined(TERN_X86_DISPATCH)
                  const bool fused = CpuHasAvx512();
#else
                  constexpr bool fused = false;
#endif
                  std::vector<float> u(format_.stochastic && !fused ? format_.block : 0);
                  for (size_t b = b0; b < b1; ++b) {
                    const size_t begin = b * format_.block;
                    const size_t n = std::min<size_t>(format_.block, x.size() - begin);
                    if (format_.stochastic && !fused) {
                      internal::FillUniform01(key, static_cast<uint32_t>(begin),
                                              static_cast<uint32_t>(n), u.data());
                    }
                    EncodeBlock(x.data() + begin, n, format_.stochastic ? u.data() : nullptr, fused,
                                static_cast<uint32_t>(begin), key, q + begin, scales, b);
                  }
                });
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool* pool) const override {
    TERN_ASSIGN_OR_RETURN(const format::Int8Header h, format::ReadInt8Header(in));
    const uint32_t block = h.block;
    const size_t nb = h.blocks;
    const uint8_t* q = h.codes;
    if (!h.minmax) {  // memchr, not a loop with an early exit: it runs at memory speed
      if (const void* bad = std::memchr(q, 0x80, in.numel); bad != nullptr) {
        return internal::PayloadError(Name(), "value -128 at ",
                                      static_cast<const uint8_t*>(bad) - q);
      }
    }
    ParallelFor(pool, nb, std::max<size_t>(1, (size_t{1} << 16) / block), 1,
                [&](size_t b0, size_t b1) {
                  for (size_t b = b0; b < b1; ++b) {
                    const size_t begin = b * block;
                    const size_t n = std::min<size_t>(block, in.numel - begin);
                    float* o = out.data() + begin;
                    if (!h.minmax) {
                      DequantizeAbsMax(accumulate, q + begin, n, in.scales[b], weight, o);
                    } else {
                      DequantizeMinMax(accumulate, q + begin, n, in.scales[2 * b],
                                       in.scales[2 * b + 1], weight, o);
                    }
                  }
                });
    return absl::OkStatus();
  }

 private:
  // `u`: per-element uniforms for stochastic rounding, or nullptr for nearest; with `fused`
  // (an AVX-512 machine) one fused loop quantises instead, drawing in-register for elements
  // first .. first + n.
  void EncodeBlock(const float* x, size_t n, const float* u, bool fused, uint32_t first, RngKey key,
                   uint8_t* q, float* scales, size_t b) const {
    float lo = 0, inv;
    if (!format_.minmax) {
      const float m = internal::MaxAbs(absl::MakeConstSpan(x, n));
      scales[b] = m / 127.0f;
      inv = m > 0 ? 127.0f / m : 0.0f;
    } else {
      float hi;
#if defined(TERN_X86_DISPATCH)
      fused ? MinMaxAvx512(x, n, &lo, &hi) : MinMax(x, n, &lo, &hi);
#else
      MinMax(x, n, &lo, &hi);
#endif
      scales[2 * b] = lo;
      scales[2 * b + 1] = (hi - lo) / 255.0f;
      inv = hi > lo ? 255.0f / (hi - lo) : 0.0f;
    }
#if defined(TERN_X86_DISPATCH)
    if (fused) {
      if (format_.stochastic) {
        return format_.minmax ? QuantizeAvx512<true, true>(x, n, first, key, lo, inv, q)
                              : QuantizeAvx512<false, true>(x, n, first, key, lo, inv, q);
      }
      return format_.minmax ? QuantizeAvx512<true, false>(x, n, first, key, lo, inv, q)
                            : QuantizeAvx512<false, false>(x, n, first, key, lo, inv, q);
    }
#endif
    format_.minmax ? QuantizeMinMax(x, n, lo, inv, u, q) : QuantizeAbsMax(x, n, inv, u, q);
  }

  const format::Int8Params format_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewInt8Codec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::Int8Params p, format::ParseInt8Params(params));
  return std::make_unique<Int8Codec>(p);
}

}  // namespace tern
