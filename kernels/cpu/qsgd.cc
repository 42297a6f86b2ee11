#include "kernels/cpu/qsgd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bit_io.h"
#include "common/byte_io.h"
#include "common/rng.h"
#include "common/simd.h"
#include "common/simd_rng.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"

namespace tern {
namespace {

constexpr uint32_t kQsgdMaxLevels = 1u << 24;
constexpr size_t kQsgdBlock = 4096;

// Stochastic levels of one block: l = floor(r) + (u < r - floor(r)), r = |x| * scale, l <= s.
// Returns whether any level is non-zero.
TERN_MULTIVERSION bool Levels(const float* x, uint32_t n, uint32_t first, RngKey key, float scale,
                              float s, uint32_t* lv) {
  uint32_t any = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const float r = std::fabs(x[i]) * scale;
    const float f = std::floor(r);
    const float l = f + (Uniform01Lo(key, first + i) < r - f ? 1.0f : 0.0f);
    lv[i] = static_cast<uint32_t>(static_cast<int32_t>(std::min(l, s)));
    any |= lv[i];
  }
  return any != 0;
}

#if defined(TERN_X86_DISPATCH)
// The same levels 16 at a time (bit-identical: the same float operations and draws), plus one
// bit per level saying whether it is non-zero, so the emitter visits only those. n % 16 == 0.
TERN_TARGET_AVX512 bool LevelsAvx512(const float* x, uint32_t n, uint32_t first, RngKey key,
                                     float scale, float s, uint32_t* lv, uint16_t* nonzero) {
  const internal::LaneRng16 rng = internal::MakeLaneRng16(key);
  const __m512 vscale = _mm512_set1_ps(scale), vs = _mm512_set1_ps(s), one = _mm512_set1_ps(1.0f);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  uint32_t any = 0;
  for (uint32_t i = 0; i < n; i += 16) {
    const __m512 ax = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(x + i)), abs_mask));
    const __m512 r = _mm512_mul_ps(ax, vscale);
    const __m512 f = _mm512_roundscale_ps(r, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __mmask16 up =
        _mm512_cmp_ps_mask(internal::Uniform16(rng, first + i), _mm512_sub_ps(r, f), _CMP_LT_OQ);
    // min(s, l) keeps a NaN l, as std::min(l, s) does.
    const __m512 l = _mm512_min_ps(vs, _mm512_mask_add_ps(f, up, f, one));
    const __m512i li = _mm512_cvttps_epi32(l);
    _mm512_storeu_si512(lv + i, li);
    const __mmask16 m = _mm512_test_epi32_mask(li, li);
    nonzero[i / 16] = static_cast<uint16_t>(m);
    any |= m;
  }
  return any != 0;
}
#endif

class QsgdCodec final : public Codec {
 public:
  explicit QsgdCodec(uint32_t levels) : levels_(levels), params_(absl::StrCat("levels=", levels)) {}
  absl::string_view Name() const override { return "qsgd.v1"; }
  std::string Spec() const override { return absl::StrCat("qsgd:", params_); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    const float norm = static_cast<float>(std::sqrt(internal::SumSquares(x)));
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.assign(1, norm);
    out->payload.clear();
    ByteWriter header(&out->payload);
    header.U32(levels_);
    header.U32(0);  // nnz, patched below
    uint32_t nnz = 0;
    if (norm > 0) {
      BitWriter bits(&out->payload);
      const RngKey key = MakeRngKey(options.seed);
      const float scale = static_cast<float>(levels_) / norm;
      uint32_t lv[kQsgdBlock];
      uint16_t nonzero[kQsgdBlock / 16];
      int64_t prev = -1;
      auto emit = [&](size_t idx, uint32_t level) {
        bits.WriteGamma(static_cast<uint64_t>(static_cast<int64_t>(idx) - prev));  // gap + 1
        bits.WriteGamma(level);
        bits.Write(x[idx] < 0 ? 1 : 0, 1);
        prev = static_cast<int64_t>(idx);
        ++nnz;
      };
      const bool avx512 = CpuHasAvx512();
      for (size_t b = 0; b < x.size(); b += kQsgdBlock) {
        const size_t n = std::min(kQsgdBlock, x.size() - b);
#if defined(TERN_X86_DISPATCH)
        if (avx512 && n % 16 == 0) {
          if (!LevelsAvx512(x.data() + b, static_cast<uint32_t>(n), static_cast<uint32_t>(b), key,
                            scale, static_cast<float>(levels_), lv, nonzero)) {
            continue;
          }
          for (size_t w = 0; w < n / 16; ++w) {
            for (uint32_t m = nonzero[w]; m != 0; m &= m - 1) {
              const size_t i = w * 16 + static_cast<size_t>(__builtin_ctz(m));
              emit(b + i, lv[i]);
            }
          }
          continue;
        }
#endif
        if (!Levels(x.data() + b, static_cast<uint32_t>(n), static_cast<uint32_t>(b), key, scale,
                    static_cast<float>(levels_), lv)) {
          continue;
        }
        for (size_t i = 0; i < n; ++i) {
          if (i % 16 == 0 && i + 16 <= n) {  // skip all-zero runs 16 levels at a time
            uint32_t group = 0;
            for (size_t j = 0; j < 16; ++j) group |= lv[i + j];
            if (group == 0) {
              i += 15;
              continue;
            }
          }
          if (lv[i] != 0) emit(b + i, lv[i]);
        }
      }
      bits.Finish();
    }
    std::memcpy(out->payload.data() + 4, &nnz, 4);
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool*) const override {
    ByteReader r(in.payload.data(), in.payload.size());
    uint32_t s, nnz;
    if (!r.U32(&s) || !r.U32(&nnz)) return internal::PayloadError(Name(), "truncated header");
    if (s == 0 || s > kQsgdMaxLevels) {
      return internal::PayloadError(Name(), "levels ", s, " outside [1, 2^24]");
    }
    if (nnz > in.numel) return internal::PayloadError(Name(), "nnz ", nnz, " > numel ", in.numel);
    TERN_RETURN_IF_ERROR(internal::CheckScales(Name(), in, 1));
    // Decode into scratch first so that a bad stream leaves `out` untouched.
    std::vector<uint32_t> idx(nnz);
    std::vector<float> val(nnz);
    BitReader bits(r.ptr(), r.remaining());
    const float unit = in.scales[0] / static_cast<float>(s);
    int64_t prev = -1;
    for (uint32_t j = 0; j < nnz; ++j) {
      uint64_t gap, level, sign;
      if (!bits.ReadGamma(33, &gap) || !bits.ReadGamma(25, &level) || !bits.Read(1, &sign)) {
        return internal::PayloadError(Name(), "bitstream ends or is malformed at non-zero ", j);
      }
      const uint64_t pos = static_cast<uint64_t>(prev + 1) + gap - 1;  // coded value is pos - prev
      if (pos >= in.numel) {
        return internal::PayloadError(Name(), "position ", pos, " out of range at non-zero ", j);
      }
      if (level > s) return internal::PayloadError(Name(), "level ", level, " > ", s);
      idx[j] = static_cast<uint32_t>(pos);
      val[j] = (sign ? -unit : unit) * static_cast<float>(level);
      prev = static_cast<int64_t>(pos);
    }
    if (!bits.AtCanonicalEnd()) {
      return internal::PayloadError(Name(), "trailing bits after ", nnz, " non-zeros");
    }
    if (!accumulate) std::fill(out.begin(), out.end(), 0.0f);
    for (uint32_t j = 0; j < nnz; ++j) {
      if (accumulate) {
        out[idx[j]] += weight * val[j];
      } else {
        out[idx[j]] = val[j];
      }
    }
    return absl::OkStatus();
  }

 private:
  const uint32_t levels_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewQsgdCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(int64_t levels, params.Int("levels", 16, 1, kQsgdMaxLevels));
  return std::make_unique<QsgdCodec>(static_cast<uint32_t>(levels));
}

}  // namespace tern
