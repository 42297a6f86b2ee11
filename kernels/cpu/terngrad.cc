#include "kernels/cpu/terngrad.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/simd.h"
#include "common/simd_rng.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/format/terngrad.h"

namespace tern {
namespace {

constexpr uint8_t k2Bit = format::kTernGrad2Bit;
constexpr uint8_t kBase3 = format::kTernGradBase3;
constexpr size_t kTernGradBlock = 4000;  // values per work item: a multiple of 32 and of 5, so
                                         // packed blocks start on byte boundaries in both packings

// Ternary digit of x: 0 (zero), 1 (+s) or 2 (-s).
TERN_MULTIVERSION void Ternarize(const float* x, uint32_t n, uint32_t first, RngKey key,
                                 float inv_s, float s, uint8_t* t) {
  for (size_t i = 0; i < n; ++i) {  // written so that GCC vectorises it
    const float a = std::fabs(x[i]) < s ? std::fabs(x[i]) : s;
    const int keep = Uniform01Lo(key, first + static_cast<uint32_t>(i)) < a * inv_s;
    const int neg = x[i] < 0;
    t[i] = static_cast<uint8_t>(keep + (keep & neg));  // 0, 1 (+s) or 2 (-s)
  }
}

TERN_MULTIVERSION void Pack2Bit(const uint8_t* t, size_t n, uint8_t* out) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    out[i / 4] = static_cast<uint8_t>(t[i] | t[i + 1] << 2 | t[i + 2] << 4 | t[i + 3] << 6);
  }
  if (i < n) {
    unsigned b = 0;
    for (size_t j = 0; i + j < n; ++j) b |= t[i + j] << (2 * j);
    out[i / 4] = static_cast<uint8_t>(b);
  }
}

#if defined(TERN_X86_DISPATCH)
// The loop-invariant vectors of TernarizePack2BitAvx2.
struct TernaryConsts {
  internal::LaneRng8 rng;
  __m256i shifts, one;
  __m256 abs_mask, s, inv, zero;
};

// 2-bit codes of 8 values, already shifted to their field in the packed byte.
__attribute__((target("avx2"), always_inline)) inline __m256i TernaryCodes8(const TernaryConsts& c,
                                                                            const float* xp,
                                                                            uint32_t idx) {
  const __m256 v = _mm256_loadu_ps(xp);
  const __m256 a = _mm256_min_ps(_mm256_and_ps(v, c.abs_mask), c.s);  // = (|x| < s ? |x| : s)
  const __m256 u = internal::Uniform8(c.rng, idx);
  const __m256i keep = _mm256_castps_si256(_mm256_cmp_ps(u, _mm256_mul_ps(a, c.inv), _CMP_LT_OQ));
  const __m256i neg = _mm256_castps_si256(_mm256_cmp_ps(v, c.zero, _CMP_LT_OQ));
  const __m256i t = _mm256_and_si256(keep, _mm256_sub_epi32(c.one, neg));  // 0, 1 or 2
  return _mm256_sllv_epi32(t, c.shifts);
}

// Ternarize + Pack2Bit fused for n a multiple of 32, with the same arithmetic as the scalar loops
// (so payloads are byte-identical): GCC's own vectorisation of the two loops spends most of its
// time narrowing 32-bit lanes to bytes and then re-gathering them for packing.
__attribute__((target("avx2"))) void TernarizePack2BitAvx2(const float* x, uint32_t n,
                                                           uint32_t first, RngKey key, float inv_s,
                                                           float s, uint8_t* out) {
  TernaryConsts c;
  c.rng = internal::MakeLaneRng8(key);
  c.shifts = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  c.one = _mm256_set1_epi32(1);
  c.abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  c.s = _mm256_set1_ps(s);
  c.inv = _mm256_set1_ps(inv_s);
  c.zero = _mm256_setzero_ps();
  // Low byte of each dword, to the low 4 bytes of each 128-bit lane.
  const __m128i low_bytes =
      _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  for (uint32_t i = 0; i < n; i += 32) {
    const __m256i c0 = TernaryCodes8(c, x + i, first + i);
    const __m256i c1 = TernaryCodes8(c, x + i + 8, first + i + 8);
    const __m256i c2 = TernaryCodes8(c, x + i + 16, first + i + 16);
    const __m256i c3 = TernaryCodes8(c, x + i + 24, first + i + 24);
    // Two rounds of pairwise sums (the fields are disjoint, so sums are ORs): lane 0 ends with
    // the bytes for elements 0-3 of c0..c3, lane 1 with those for elements 4-7.
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(c0, c1), _mm256_hadd_epi32(c2, c3));
    const __m128i lo = _mm_shuffle_epi8(_mm256_castsi256_si128(h), low_bytes);
    const __m128i hi = _mm_shuffle_epi8(_mm256_extracti128_si256(h, 1), low_bytes);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i / 4), _mm_unpacklo_epi8(lo, hi));
  }
}
#endif

#if defined(TERN_X86_DISPATCH)
// The same for 16 lanes: the comparisons land in mask registers, and PDEP interleaves the
// "+s" and "-s" masks into the 2-bit fields of 4 packed bytes.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,bmi2"))) void TernarizePack2BitAvx512(
    const float* x, uint32_t n, uint32_t first, RngKey key, float inv_s, float s, uint8_t* out) {
  const internal::LaneRng16 rng = internal::MakeLaneRng16(key);
  const __m512 vs = _mm512_set1_ps(s), vinv = _mm512_set1_ps(inv_s), zero = _mm512_setzero_ps();
  for (uint32_t i = 0; i < n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i + 512), _MM_HINT_T0);
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 a = _mm512_min_ps(_mm512_abs_ps(v), vs);  // = (|x| < s ? |x| : s)
    const __m512 u = internal::Uniform16(rng, first + i);
    const __mmask16 keep = _mm512_cmp_ps_mask(u, _mm512_mul_ps(a, vinv), _CMP_LT_OQ);
    const __mmask16 neg = _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ);
    const uint32_t pos_bits = _cvtmask16_u32(_kandn_mask16(neg, keep));
    const uint32_t neg_bits = _cvtmask16_u32(_kand_mask16(neg, keep));
    const uint32_t packed = _pdep_u32(pos_bits, 0x55555555U) | _pdep_u32(neg_bits, 0xaaaaaaaaU);
    std::memcpy(out + i / 4, &packed, 4);
  }
}
#endif

#if defined(TERN_X86_DISPATCH)
// Ternarize + PackBase3 fused, 80 values (16 bytes) at a time, bit-identical to the scalar
// loops: contiguous loads and draws as in the 2-bit loop, then 80 digits become 80 bytes in two
// registers, one VBMI byte permute across both brings digits 5j+k into plane k (16 bytes each), and
// Horner's rule in bytes (all sums <= 242) packs them. Handles the largest multiple of 80 of n;
// returns how many values it did.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,bmi2"))) uint32_t
TernarizePackBase3Vbmi(const float* x, uint32_t n, uint32_t first, RngKey key, float inv_s, float s,
                       uint8_t* out) {
  const internal::LaneRng16 rng = internal::MakeLaneRng16(key);
  const __m512 vs = _mm512_set1_ps(s), vinv = _mm512_set1_ps(inv_s), zero = _mm512_setzero_ps();
  const __m128i one = _mm_set1_epi8(1), two = _mm_set1_epi8(2);
  // Plane k (k < 4) in 128-bit lane k of the first permute, plane 4 in lane 0 of the second.
  alignas(64) uint8_t idx[2][64];
  for (int k = 0; k < 5; ++k) {
    for (int j = 0; j < 16; ++j) idx[k / 4][16 * (k % 4) + j] = static_cast<uint8_t>(5 * j + k);
  }
  for (int l = 16; l < 64; ++l) idx[1][l] = 0;
  const __m512i idx0123 = _mm512_load_si512(idx[0]), idx4 = _mm512_load_si512(idx[1]);
  const uint32_t done = n - n % 80;
  for (uint32_t i = 0; i < done; i += 80) {
    __m128i d[5];
    for (uint32_t m = 0; m < 5; ++m) {
      const __m512 v = _mm512_loadu_ps(x + i + 16 * m);
      const __m512 a = _mm512_min_ps(_mm512_abs_ps(v), vs);  // = (|x| < s ? |x| : s)
      const __m512 u = internal::Uniform16(rng, first + i + 16 * m);
      const __mmask16 keep = _mm512_cmp_ps_mask(u, _mm512_mul_ps(a, vinv), _CMP_LT_OQ);
      const __mmask16 neg = _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ);
      d[m] = _mm_or_si128(_mm_maskz_mov_epi8(_kandn_mask16(neg, keep), one),
                          _mm_maskz_mov_epi8(_kand_mask16(neg, keep), two));
    }
    __m512i lo = _mm512_castsi128_si512(d[0]);
    lo = _mm512_inserti32x4(lo, d[1], 1);
    lo = _mm512_inserti32x4(lo, d[2], 2);
    lo = _mm512_inserti32x4(lo, d[3], 3);
    const __m512i hi = _mm512_castsi128_si512(d[4]);
    const __m512i p = _mm512_permutex2var_epi8(lo, idx0123, hi);
    const __m128i p4 = _mm512_castsi512_si128(_mm512_permutex2var_epi8(lo, idx4, hi));
    __m128i acc = p4;
    const __m128i planes[4] = {_mm512_castsi512_si128(p), _mm512_extracti32x4_epi32(p, 1),
                               _mm512_extracti32x4_epi32(p, 2), _mm512_extracti32x4_epi32(p, 3)};
    for (int k = 3; k >= 0; --k) {
      acc = _mm_add_epi8(_mm_add_epi8(acc, _mm_add_epi8(acc, acc)), planes[k]);  // acc * 3 + p_k
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i / 5), acc);
  }
  return done;
}
#endif

TERN_MULTIVERSION void PackBase3(const uint8_t* t, size_t n, uint8_t* out) {
  size_t i = 0;
  for (; i + 5 <= n; i += 5) {
    out[i / 5] =
        static_cast<uint8_t>(t[i] + 3 * t[i + 1] + 9 * t[i + 2] + 27 * t[i + 3] + 81 * t[i + 4]);
  }
  if (i < n) {
    unsigned b = 0;
    for (size_t j = n - i; j-- > 0;) b = b * 3 + t[i + j];
    out[i / 5] = static_cast<uint8_t>(b);
  }
}

// Byte -> its decoded values (4 for 2-bit packing, 5 for base 3), already times the scale (and
// the weight when accumulating), so decoding is a table copy per byte.
template <int kPer>
struct ByteTable {
  float v[256][kPer];
};

ByteTable<4> Make2BitTable(float s) {
  const float digit[4] = {0.0f, s, -s, 0.0f};
  ByteTable<4> t;
  for (int b = 0; b < 256; ++b) {
    for (int j = 0; j < 4; ++j) t.v[b][j] = digit[(b >> (2 * j)) & 3];
  }
  return t;
}

ByteTable<5> MakeBase3Table(float s) {
  const float digit[3] = {0.0f, s, -s};
  ByteTable<5> t{};
  for (int b = 0; b < 243; ++b) {
    for (int j = 0, r = b; j < 5; ++j, r /= 3) t.v[b][j] = digit[r % 3];
  }
  return t;
}

template <bool kAccumulate, int kPer>
void UnpackWithTable(const ByteTable<kPer>& table, const uint8_t* in, size_t n, float w,
                     float* out) {
  size_t i = 0;
  for (; i + kPer <= n; i += kPer) {
    const float* v = table.v[in[i / kPer]];
    for (int j = 0; j < kPer; ++j) internal::Store<kAccumulate>(out, i + j, v[j], w);
  }
  for (int j = 0; i + j < n; ++j)
    internal::Store<kAccumulate>(out, i + j, table.v[in[i / kPer]][j], w);
}

#if defined(TERN_X86_DISPATCH)
// Writes the values of 2-bit codes in[0 .. n/4) 16 at a time (codes 0, 1, 2 -> 0, +s, -s; the
// codes are already validated). With `stream`, the output goes out with non-temporal stores
// after a scalar head up to the first 64-byte boundary: see kStreamingStoreBytes.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,bmi2"))) void Unpack2BitAvx512(
    const ByteTable<4>& table, const uint8_t* in, size_t n, float s, float* out, bool stream) {
  size_t i = 0;
  if (stream) {
    const size_t misalign = reinterpret_cast<uintptr_t>(out) % 64;
    if (misalign % 4 != 0) stream = false;
    for (const size_t head = stream ? std::min(n, (64 - misalign) % 64 / 4) : 0; i < head; ++i) {
      out[i] = table.v[in[i / 4]][i % 4];
    }
  }
  const __m512 digit = _mm512_setr_ps(0.0f, s, -s, 0.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i shift =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i three = _mm512_set1_epi32(3);
  for (; i + 16 <= n; i += 16) {
    // 32 bits of codes from bit 2 * (i % 4) of byte i / 4: four bytes, or five when i is not a
    // multiple of 4 (byte (i + 15) / 4 is still inside the block).
    uint32_t lo;
    std::memcpy(&lo, in + i / 4, 4);
    const uint64_t word = uint64_t{lo} | uint64_t{i % 4 != 0 ? in[i / 4 + 4] : uint8_t{0}} << 32;
    const uint32_t codes = static_cast<uint32_t>(word >> (2 * (i % 4)));
    const __m512i c = _mm512_and_si512(
        _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(codes)), shift), three);
    const __m512 v = _mm512_permutexvar_ps(c, digit);
    if (stream) {
      _mm512_stream_ps(out + i, v);
    } else {
      _mm512_storeu_ps(out + i, v);
    }
  }
  for (; i < n; ++i) out[i] = table.v[in[i / 4]][i % 4];
}
#endif

// OR over the bytes of (b & 0x55) & (b >> 1): non-zero iff some 2-bit field holds code 3.
// No early exit, so GCC vectorises it; callers run it over a few KiB at a time.
TERN_MULTIVERSION uint8_t Invalid2BitCodes(const uint8_t* b, size_t n) {
  uint8_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= (b[i] & 0x55) & (b[i] >> 1);
  return bad;
}
// Largest byte (base-3 bytes must be < 3^5 = 243).
TERN_MULTIVERSION uint8_t MaxByte(const uint8_t* b, size_t n) {
  uint8_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, b[i]);
  return m;
}

class TernGradCodec final : public Codec {
 public:
  explicit TernGradCodec(const format::TernGradParams& p) : format_(p), params_(p.Canonical()) {}
  absl::string_view Name() const override { return format::kTernGradName; }
  std::string Spec() const override { return format_.Spec(); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    float s;
    if (format_.clip > 0 && !x.empty()) {
      // sigma from E[x^2] - E[x]^2 (gradients are near zero-mean, so this is well conditioned);
      // one fused pass gives it and max |x|.
      const internal::Moments m = internal::ComputeMoments(x);
      const double mean = m.sum / x.size();
      const double var = std::max(0.0, m.sum_squares / x.size() - mean * mean);
      s = std::min(m.max_abs, static_cast<float>(format_.clip * std::sqrt(var)));
    } else {
      s = internal::MaxAbs(x);
    }
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.assign(1, s);
    uint8_t* p = internal::ResizePayload(&out->payload,
                                         1 + format::TernGradPackedBytes(format_.pack, x.size()));
    p[0] = format_.pack;
    const RngKey key = MakeRngKey(options.seed);
    const float inv = s > 0 ? 1.0f / s : 0.0f;
    const size_t nblocks = (x.size() + kTernGradBlock - 1) / kTernGradBlock;
    ParallelFor(options.pool, nblocks, 16, 1, [&](size_t b0, size_t b1) {
      uint8_t t[kTernGradBlock];
      for (size_t b = b0; b < b1; ++b) {
        const size_t begin = b * kTernGradBlock, n = std::min(kTernGradBlock, x.size() - begin);
#if defined(TERN_X86_DISPATCH)
        if (format_.pack == k2Bit && n % 32 == 0 && CpuHasAvx512()) {
          TernarizePack2BitAvx512(x.data() + begin, static_cast<uint32_t>(n),
                                  static_cast<uint32_t>(begin), key, inv, s, p + 1 + begin / 4);
          continue;
        }
        if (format_.pack == k2Bit && n % 32 == 0 && CpuHasAvx2F16c()) {
          TernarizePack2BitAvx2(x.data() + begin, static_cast<uint32_t>(n),
                                static_cast<uint32_t>(begin), key, inv, s, p + 1 + begin / 4);
          continue;
        }
#endif
        size_t head = 0;  // values of this block already packed by a SIMD loop (base 3)
#if defined(TERN_X86_DISPATCH)
        if (format_.pack == kBase3 && CpuHasAvx512Vbmi()) {
          head =
              TernarizePackBase3Vbmi(x.data() + begin, static_cast<uint32_t>(n),
                                     static_cast<uint32_t>(begin), key, inv, s, p + 1 + begin / 5);
        }
#endif
        const size_t start = begin + head, rest = n - head;  // head is a multiple of 5
        if (rest == 0) continue;
        Ternarize(x.data() + start, static_cast<uint32_t>(rest), static_cast<uint32_t>(start), key,
                  inv, s, t);
        if (format_.pack == k2Bit) {
          Pack2Bit(t, rest, p + 1 + start / 4);
        } else {
          PackBase3(t, rest, p + 1 + start / 5);
        }
      }
    });
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool* pool) const override {
    TERN_ASSIGN_OR_RETURN(const format::TernGradHeader h, format::ReadTernGradHeader(in));
    const uint8_t pack = h.pack;
    const size_t bytes = h.bytes;
    const uint8_t* body = h.body;
    // Validate every code (and canonical zero padding) before touching `out`.
    // Checked 4 KiB at a time with vectorised reductions; the byte-exact loop runs only in the
    // chunk that failed, to name the byte.
    constexpr size_t kChunk = 4096;
    if (pack == k2Bit) {
      for (size_t c = 0; c < bytes; c += kChunk) {
        const size_t len = std::min(kChunk, bytes - c);
        if (Invalid2BitCodes(body + c, len) == 0) continue;
        for (size_t i = c;; ++i) {
          if (Invalid2BitCodes(body + i, 1) != 0) {
            return internal::PayloadError(Name(), "invalid 2-bit code 3 in byte ", i);
          }
        }
      }
    } else {
      for (size_t c = 0; c < bytes; c += kChunk) {
        const size_t len = std::min(kChunk, bytes - c);
        if (MaxByte(body + c, len) < 243) continue;
        for (size_t i = c;; ++i) {
          if (body[i] >= 243) return internal::PayloadError(Name(), "byte ", i, " >= 3^5");
        }
      }
    }
    const float s = in.scales[0];
    const auto t2 = pack == k2Bit ? Make2BitTable(s) : ByteTable<4>{};
    const auto t3 = pack == kBase3 ? MakeBase3Table(s) : ByteTable<5>{};
    const size_t nblocks = (in.numel + kTernGradBlock - 1) / kTernGradBlock;
#if defined(TERN_X86_DISPATCH)
    const bool avx512 = pack == k2Bit && !accumulate && CpuHasAvx512();
    const bool stream = in.numel * sizeof(float) >= internal::kStreamingStoreBytes;
#endif
    ParallelFor(pool, nblocks, 16, 1, [&](size_t b0, size_t b1) {
      for (size_t b = b0; b < b1; ++b) {
        const size_t begin = b * kTernGradBlock, n = std::min(kTernGradBlock, in.numel - begin);
        float* o = out.data() + begin;
#if defined(TERN_X86_DISPATCH)
        if (avx512) {
          Unpack2BitAvx512(t2, body + begin / 4, n, s, o, stream);
          continue;
        }
#endif
        if (pack == k2Bit) {
          accumulate ? UnpackWithTable<true>(t2, body + begin / 4, n, weight, o)
                     : UnpackWithTable<false>(t2, body + begin / 4, n, weight, o);
        } else {
          accumulate ? UnpackWithTable<true>(t3, body + begin / 5, n, weight, o)
                     : UnpackWithTable<false>(t3, body + begin / 5, n, weight, o);
        }
      }
    });
#if defined(TERN_X86_DISPATCH)
    if (avx512 && stream) _mm_sfence();  // order the streaming stores before the caller reads
#endif
    return absl::OkStatus();
  }

 private:
  const format::TernGradParams format_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewTernGradCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::TernGradParams p, format::ParseTernGradParams(params));
  return std::make_unique<TernGradCodec>(p);
}

}  // namespace tern
