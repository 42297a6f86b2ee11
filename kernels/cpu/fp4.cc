#include "kernels/cpu/fp4.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "common/rng.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/format/fp4.h"

namespace tern {
namespace {

// Rounding thresholds of one element format: nearest rounds up at a midpoint.
struct Fp4Grid {
  format::Fp4Table m;
  std::array<float, 7> mid;  // (m[j] + m[j + 1]) / 2
  std::array<float, 7> gap;  // m[j + 1] - m[j]
};

Fp4Grid MakeFp4Grid(uint8_t element) {
  Fp4Grid g;
  g.m = format::Fp4Magnitudes(element);
  for (int j = 0; j < 7; ++j) {
    g.mid[j] = 0.5f * (g.m[j] + g.m[j + 1]);
    g.gap[j] = g.m[j + 1] - g.m[j];
  }
  return g;
}

// The magnitude index of r = |x| / scale in [0, 1]: the nearest, or with `u` (a uniform draw)
// the lower or upper neighbour with the probabilities that make it unbiased. NaN gives 0.
inline uint8_t Fp4MagnitudeIndex(const Fp4Grid& g, float r, const float* u) {
  uint8_t m = 0;
  if (u == nullptr) {
    for (int j = 0; j < 7; ++j) m += r >= g.mid[j];
    return m;
  }
  for (int j = 1; j < 8; ++j) m += r >= g.m[j];
  if (m == 7) return 7;
  const float p = (r - g.m[m]) / g.gap[m];
  return static_cast<uint8_t>(m + (*u < p));
}

void Fp4EncodeBlock(const Fp4Grid& g, const float* x, size_t n, size_t first, const float* u,
                    uint8_t* codes, float* scale) {
  const float s = internal::MaxAbs(absl::MakeConstSpan(x, n));
  *scale = s;
  const float inv = s > 0 ? 1.0f / s : 0.0f;
  for (size_t i = 0; i < n; ++i) {
    float r = std::fabs(x[i]) * inv;
    r = r > 1.0f ? 1.0f : r;  // not std::min, which turns a NaN into 1: a NaN encodes as 0
    uint8_t c = Fp4MagnitudeIndex(g, r, u == nullptr ? nullptr : u + i);
    if (c != 0 && std::signbit(x[i])) c |= 8;
    const size_t at = first + i;
    // Blocks may start on an odd element: each value writes its own nibble.
    uint8_t& byte = codes[at / 2];
    byte = (at % 2 == 0) ? static_cast<uint8_t>((byte & 0xf0) | c)
                         : static_cast<uint8_t>((byte & 0x0f) | (c << 4));
  }
}

template <bool kAccumulate>
void Fp4DecodeBlock(const uint8_t* codes, size_t first, size_t n, const float* lut, float w,
                    float* out) {
  for (size_t i = 0; i < n; ++i) {
    const size_t at = first + i;
    const uint8_t c = (codes[at / 2] >> (4 * (at % 2))) & 0x0f;
    internal::Store<kAccumulate>(out, i, lut[c], w);
  }
}

class Fp4Codec final : public Codec {
 public:
  explicit Fp4Codec(const format::Fp4Params& p)
      : format_(p), params_(p.Canonical()), grid_(MakeFp4Grid(p.element)) {}
  absl::string_view Name() const override { return format::kFp4Name; }
  std::string Spec() const override { return format_.Spec(); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    const size_t nb = format_.Blocks(x.size());
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.resize(nb);
    uint8_t* p =
        internal::ResizePayload(&out->payload, format::kFp4HeaderBytes + (x.size() + 1) / 2);
    format::WriteFp4Header(format_, p);
    uint8_t* codes = p + format::kFp4HeaderBytes;
    std::fill(codes, codes + (x.size() + 1) / 2, uint8_t{0});
    const RngKey key = MakeRngKey(options.seed);
    float* scales = out->scales.data();
    // An odd block shares a byte with the next: pieces then start on even blocks.
    ParallelFor(
        options.pool, nb, std::max<size_t>(1, (size_t{1} << 16) / format_.block),
        format_.block % 2 == 0 ? 1 : 2, [&](size_t b0, size_t b1) {
          std::vector<float> u(format_.stochastic ? std::min<size_t>(format_.block, x.size()) : 0);
          for (size_t b = b0; b < b1; ++b) {
            const size_t begin = b * format_.block;
            const size_t n = std::min<size_t>(format_.block, x.size() - begin);
            if (format_.stochastic) {
              internal::FillUniform01(key, static_cast<uint32_t>(begin), static_cast<uint32_t>(n),
                                      u.data());
            }
            Fp4EncodeBlock(grid_, x.data() + begin, n, begin,
                           format_.stochastic ? u.data() : nullptr, codes, scales + b);
          }
        });
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool* pool) const override {
    TERN_ASSIGN_OR_RETURN(const format::Fp4Header h, format::ReadFp4Header(in));
    const format::Fp4Table& m = format::Fp4Magnitudes(h.element);
    ParallelFor(pool, h.blocks, std::max<size_t>(1, (size_t{1} << 16) / h.block), 1,
                [&](size_t b0, size_t b1) {
                  for (size_t b = b0; b < b1; ++b) {
                    const size_t begin = b * h.block;
                    const size_t n = std::min<size_t>(h.block, in.numel - begin);
                    float lut[16];
                    for (int c = 0; c < 8; ++c) {
                      lut[c] = m[c] * in.scales[b];
                      lut[c + 8] = -lut[c];
                    }
                    accumulate
                        ? Fp4DecodeBlock<true>(h.codes, begin, n, lut, weight, out.data() + begin)
                        : Fp4DecodeBlock<false>(h.codes, begin, n, lut, weight, out.data() + begin);
                  }
                });
    return absl::OkStatus();
  }

 private:
  const format::Fp4Params format_;
  const std::string params_;
  const Fp4Grid grid_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewFp4Codec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::Fp4Params p, format::ParseFp4Params(params));
  return std::make_unique<Fp4Codec>(p);
}

}  // namespace tern
