#include "kernels/cpu/terngrad.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/simd.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "kernels/cpu/codec_util.h"

namespace tern {
namespace {

constexpr uint8_t k2Bit = 0;
constexpr uint8_t kBase3 = 1;
constexpr size_t kBlock = 4000;  // values per work item: a multiple of 4 and of 5, so packed
                                 // blocks start on byte boundaries in both packings

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

size_t PackedBytes(uint8_t pack, size_t n) { return pack == k2Bit ? (n + 3) / 4 : (n + 4) / 5; }

class TernGradCodec final : public Codec {
 public:
  TernGradCodec(double clip, uint8_t pack)
      : clip_(clip),
        pack_(pack),
        params_(absl::StrCat("clip=", clip, ",pack=", pack == k2Bit ? "2bit" : "base3")) {}
  absl::string_view Name() const override { return "terngrad.v1"; }
  std::string Spec() const override { return absl::StrCat("terngrad:", params_); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    float s;
    if (clip_ > 0 && !x.empty()) {
      // sigma from E[x^2] - E[x]^2 (gradients are near zero-mean, so this is well conditioned);
      // one fused pass gives it and max |x|.
      const internal::Moments m = internal::ComputeMoments(x);
      const double mean = m.sum / x.size();
      const double var = std::max(0.0, m.sum_squares / x.size() - mean * mean);
      s = std::min(m.max_abs, static_cast<float>(clip_ * std::sqrt(var)));
    } else {
      s = internal::MaxAbs(x);
    }
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.assign(1, s);
    uint8_t* p = internal::ResizePayload(&out->payload, 1 + PackedBytes(pack_, x.size()));
    p[0] = pack_;
    const RngKey key = MakeRngKey(options.seed);
    const float inv = s > 0 ? 1.0f / s : 0.0f;
    const size_t nblocks = (x.size() + kBlock - 1) / kBlock;
    ParallelFor(options.pool, nblocks, 16, 1, [&](size_t b0, size_t b1) {
      uint8_t t[kBlock];
      for (size_t b = b0; b < b1; ++b) {
        const size_t begin = b * kBlock, n = std::min(kBlock, x.size() - begin);
        Ternarize(x.data() + begin, static_cast<uint32_t>(n), static_cast<uint32_t>(begin), key,
                  inv, s, t);
        if (pack_ == k2Bit) {
          Pack2Bit(t, n, p + 1 + begin / 4);
        } else {
          PackBase3(t, n, p + 1 + begin / 5);
        }
      }
    });
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool* pool) const override {
    if (in.payload.empty()) return internal::PayloadError(Name(), "truncated header");
    const uint8_t pack = in.payload[0];
    if (pack != k2Bit && pack != kBase3) {
      return internal::PayloadError(Name(), "unknown packing ", int{pack});
    }
    const size_t bytes = PackedBytes(pack, in.numel);
    if (in.payload.size() != 1 + bytes) {
      return internal::PayloadError(Name(), "expected ", 1 + bytes, " bytes, got ",
                                    in.payload.size());
    }
    TERN_RETURN_IF_ERROR(internal::CheckScales(Name(), in, 1));
    const uint8_t* body = in.payload.data() + 1;
    // Validate every code (and canonical zero padding) before touching `out`.
    if (pack == k2Bit) {
      for (size_t i = 0; i < bytes; ++i) {
        const uint8_t b = body[i];
        if (((b & 0x55) & (b >> 1)) != 0) {
          return internal::PayloadError(Name(), "invalid 2-bit code 3 in byte ", i);
        }
      }
      if (in.numel % 4 != 0 && (body[bytes - 1] >> (2 * (in.numel % 4))) != 0) {
        return internal::PayloadError(Name(), "non-zero padding in the last byte");
      }
    } else {
      for (size_t i = 0; i < bytes; ++i) {
        if (body[i] >= 243) return internal::PayloadError(Name(), "byte ", i, " >= 3^5");
      }
      if (size_t rem = in.numel % 5; rem != 0) {
        unsigned pow = 1;
        for (size_t j = 0; j < rem; ++j) pow *= 3;
        if (body[bytes - 1] >= pow) {
          return internal::PayloadError(Name(), "non-zero padding in the last byte");
        }
      }
    }
    const float s = in.scales[0];
    const auto t2 = pack == k2Bit ? Make2BitTable(s) : ByteTable<4>{};
    const auto t3 = pack == kBase3 ? MakeBase3Table(s) : ByteTable<5>{};
    const size_t nblocks = (in.numel + kBlock - 1) / kBlock;
    ParallelFor(pool, nblocks, 16, 1, [&](size_t b0, size_t b1) {
      for (size_t b = b0; b < b1; ++b) {
        const size_t begin = b * kBlock, n = std::min(kBlock, in.numel - begin);
        float* o = out.data() + begin;
        if (pack == k2Bit) {
          accumulate ? UnpackWithTable<true>(t2, body + begin / 4, n, weight, o)
                     : UnpackWithTable<false>(t2, body + begin / 4, n, weight, o);
        } else {
          accumulate ? UnpackWithTable<true>(t3, body + begin / 5, n, weight, o)
                     : UnpackWithTable<false>(t3, body + begin / 5, n, weight, o);
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  const double clip_;
  const uint8_t pack_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewTernGradCodec(CodecParams& params) {
  TERN_ASSIGN_OR_RETURN(double clip, params.Double("clip", 2.5, 0.0, 1e6));
  TERN_ASSIGN_OR_RETURN(std::string pack, params.Enum("pack", "2bit", {"2bit", "base3"}));
  return std::make_unique<TernGradCodec>(clip, pack == "2bit" ? k2Bit : kBase3);
}

}  // namespace tern
