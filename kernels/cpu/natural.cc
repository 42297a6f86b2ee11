#include "kernels/cpu/natural.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>

#include "common/rng.h"
#include "common/simd.h"
#include "common/simd_rng.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/format/natural.h"

namespace tern {
namespace {

constexpr size_t kNaturalBlock = 4096;  // multiple of 8: a block owns whole sign bytes

// The exponent code is the float's biased exponent E, plus one with probability mantissa / 2^23
// (which is (|x| - 2^e) / 2^e). Subnormals (E = 0) round between 0 and 2^-126 by the same rule.
// E = 254 never rounds up (2^128 is not a float), so code 255 never occurs.
// Returns false if the block holds Inf or NaN, which the format cannot carry.
TERN_MULTIVERSION bool EncodeBlock(const float* x, uint32_t n, uint32_t first, RngKey key,
                                   uint8_t* codes, uint8_t* signs) {
  uint32_t nonfinite = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(x[i]);
    const uint32_t e = (bits >> 23) & 0xff;
    const uint32_t mant = bits & 0x7fffff;
    const uint32_t up = ((Random32Lo(key, first + i) >> 9) < mant) & (e < 254);
    codes[i] = static_cast<uint8_t>(e + up);
    nonfinite |= e == 255;
  }
  internal::PackSignBits(x, n, signs);
  return nonfinite == 0;
}

#if defined(TERN_X86_DISPATCH)
// The same 16 at a time (n % 16 == 0), bit-identical: codes narrowed from 32-bit lanes, and the
// sign bits straight from the lanes' sign bits (16 values = 2 sign bytes, bit j = value j).
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,bmi2"))) bool EncodeBlockAvx512(
    const float* x, uint32_t n, uint32_t first, RngKey key, uint8_t* codes, uint8_t* signs) {
  const internal::LaneRng16 rng = internal::MakeLaneRng16(key);
  const __m512i ff = _mm512_set1_epi32(0xff), mant_mask = _mm512_set1_epi32(0x7fffff);
  const __m512i e254 = _mm512_set1_epi32(254), one = _mm512_set1_epi32(1);
  __mmask16 nonfinite = 0;
  for (uint32_t i = 0; i < n; i += 16) {
    const __m512i bits = _mm512_loadu_si512(x + i);
    const __m512i e = _mm512_and_si512(_mm512_srli_epi32(bits, 23), ff);
    const __m512i mant = _mm512_and_si512(bits, mant_mask);
    const __m512i r = _mm512_srli_epi32(internal::Random16(rng, first + i), 9);
    const __mmask16 up = _mm512_cmplt_epu32_mask(r, mant) & _mm512_cmplt_epu32_mask(e, e254);
    const __m512i code = _mm512_mask_add_epi32(e, up, e, one);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(code));
    const uint16_t sign = static_cast<uint16_t>(_mm512_movepi32_mask(bits));
    std::memcpy(signs + i / 8, &sign, 2);
    nonfinite |= _mm512_cmpeq_epi32_mask(e, ff);
  }
  return nonfinite == 0;
}
#endif

// Decodes one block (n <= kNaturalBlock) into `v`: the code is the float's exponent field and the
// sign bit its sign, so each value is assembled from bits in one pass.
TERN_MULTIVERSION void DecodeBlock(const uint8_t* codes, const uint8_t* signs, size_t n, float* v) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint32_t* m = internal::kSignMasks.m[signs[i / 8]];
    for (int j = 0; j < 8; ++j)
      v[i + j] = std::bit_cast<float>(uint32_t{codes[i + j]} << 23 | m[j]);
  }
  for (; i < n; ++i) {
    v[i] = std::bit_cast<float>(uint32_t{codes[i]} << 23 |
                                internal::kSignMasks.m[signs[i / 8]][i % 8]);
  }
}

#if defined(TERN_X86_DISPATCH)
// DecodeBlock 16 at a time. With `stream`, the output goes out with non-temporal stores (after a
// scalar head up to the first 64-byte boundary): a large decode's output does not fit in cache,
// and plain stores would first read every output line in (read-for-ownership), which costs as
// much memory traffic as the whole input.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,bmi2"))) void DecodeBlockAvx512(
    const uint8_t* codes, const uint8_t* signs, size_t n, float* v, bool stream) {
  auto scalar = [&](size_t i) {
    v[i] = std::bit_cast<float>(uint32_t{codes[i]} << 23 | uint32_t{(signs[i / 8] >> (i % 8)) & 1u}
                                                               << 31);
  };
  size_t i = 0;
  if (stream) {
    const size_t misalign = reinterpret_cast<uintptr_t>(v) % 64;
    if (misalign % 4 != 0) stream = false;  // never for a float array, but stay correct
    for (const size_t head = stream ? std::min(n, (64 - misalign) % 64 / 4) : 0; i < head; ++i) {
      scalar(i);
    }
  }
  const __m512i sign_bit = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  for (; i + 16 <= n; i += 16) {
    const __m512i e = _mm512_slli_epi32(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i))), 23);
    // Bits i .. i+15 of the sign bitmap: two bytes, or three when i is not byte-aligned (the
    // third is still inside this block's sign bytes because i + 15 < n).
    uint32_t bits = uint32_t{signs[i / 8]} | uint32_t{signs[i / 8 + 1]} << 8;
    if (i % 8 != 0) bits |= uint32_t{signs[i / 8 + 2]} << 16;
    const __mmask16 neg = static_cast<__mmask16>(bits >> (i % 8));
    const __m512 value = _mm512_castsi512_ps(_mm512_mask_or_epi32(e, neg, e, sign_bit));
    if (stream) {
      _mm512_stream_ps(v + i, value);
    } else {
      _mm512_storeu_ps(v + i, value);
    }
  }
  for (; i < n; ++i) scalar(i);
}
#endif

class NaturalCodec final : public Codec {
 public:
  absl::string_view Name() const override { return format::kNaturalName; }
  std::string Spec() const override { return format::kNaturalSpec; }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    internal::SetHeader(*this, "", x.size(), out);
    out->scales.clear();
    uint8_t* p = internal::ResizePayload(&out->payload, x.size() + (x.size() + 7) / 8);
    uint8_t* signs = p + x.size();
    const RngKey key = MakeRngKey(options.seed);
    const size_t nb = (x.size() + kNaturalBlock - 1) / kNaturalBlock;
    std::atomic<bool> finite{true};
    ParallelFor(options.pool, nb, 16, 1, [&](size_t b0, size_t b1) {
      for (size_t b = b0; b < b1; ++b) {
        const size_t begin = b * kNaturalBlock, n = std::min(kNaturalBlock, x.size() - begin);
#if defined(TERN_X86_DISPATCH)
        if (n % 16 == 0 && CpuHasAvx512()) {
          if (!EncodeBlockAvx512(x.data() + begin, static_cast<uint32_t>(n),
                                 static_cast<uint32_t>(begin), key, p + begin, signs + begin / 8)) {
            finite = false;
          }
          continue;
        }
#endif
        if (!EncodeBlock(x.data() + begin, static_cast<uint32_t>(n), static_cast<uint32_t>(begin),
                         key, p + begin, signs + begin / 8)) {
          finite = false;
        }
      }
    });
    if (!finite) return absl::InvalidArgumentError("natural: input holds Inf or NaN");
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool* pool) const override {
    TERN_ASSIGN_OR_RETURN(const format::NaturalHeader h, format::ReadNaturalHeader(in));
    const uint8_t* codes = h.codes;
    const uint8_t* signs = h.signs;
    // An empty payload may have no address at all: memchr must not see it.
    if (const void* bad = in.numel == 0 ? nullptr : std::memchr(codes, 0xff, in.numel);
        bad != nullptr) {
      return internal::PayloadError(Name(), "exponent code 255 at ",
                                    static_cast<const uint8_t*>(bad) - codes);
    }
    const size_t nb = (in.numel + kNaturalBlock - 1) / kNaturalBlock;
#if defined(TERN_X86_DISPATCH)
    const bool avx512 = !accumulate && CpuHasAvx512();
    const bool stream = in.numel * sizeof(float) >= internal::kStreamingStoreBytes;
#endif
    ParallelFor(pool, nb, 16, 1, [&](size_t b0, size_t b1) {
      for (size_t b = b0; b < b1; ++b) {
        const size_t begin = b * kNaturalBlock, n = std::min(kNaturalBlock, in.numel - begin);
#if defined(TERN_X86_DISPATCH)
        if (avx512) {
          DecodeBlockAvx512(codes + begin, signs + begin / 8, n, out.data() + begin, stream);
          continue;
        }
#endif
        if (accumulate) {
          alignas(64) float tmp[kNaturalBlock];
          DecodeBlock(codes + begin, signs + begin / 8, n, tmp);
          internal::AddScaled(tmp, n, weight, out.data() + begin);
        } else {
          DecodeBlock(codes + begin, signs + begin / 8, n, out.data() + begin);
        }
      }
    });
#if defined(TERN_X86_DISPATCH)
    if (avx512 && stream) _mm_sfence();  // order the streaming stores before the caller reads
#endif
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewNaturalCodec(SpecParams&) {
  return std::make_unique<NaturalCodec>();
}

}  // namespace tern
