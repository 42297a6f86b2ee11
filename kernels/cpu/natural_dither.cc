#include "kernels/cpu/natural_dither.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bit_io.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"

namespace tern {
namespace {

constexpr uint32_t kDitherMaxLevels = 30;

class NaturalDitherCodec final : public Codec {
 public:
  explicit NaturalDitherCodec(uint32_t levels)
      : levels_(levels), params_(absl::StrCat("levels=", levels)) {}
  absl::string_view Name() const override { return "natural-dither.v1"; }
  std::string Spec() const override { return absl::StrCat("natural-dither:", params_); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    const float norm = static_cast<float>(std::sqrt(internal::SumSquares(x)));
    if (!std::isfinite(norm)) return absl::InvalidArgumentError("natural-dither: non-finite input");
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.assign(1, norm);
    out->payload.assign(1, static_cast<char>(levels_));
    BitWriter bits(&out->payload);
    const int width = std::bit_width(levels_);
    const int s = static_cast<int>(levels_);
    const float lowest = std::ldexp(1.0f, 1 - s);  // the smallest non-zero level
    const float inv = norm > 0 ? 1.0f / norm : 0.0f;
    const RngKey key = MakeRngKey(options.seed);
    for (size_t i = 0; i < x.size(); ++i) {
      const float r = std::min(std::fabs(x[i]) * inv, 1.0f);
      const float u = Uniform01(key, i);
      uint32_t code;
      if (r < lowest) {
        code = u < r / lowest ? 1 : 0;
      } else {
        const int e = static_cast<int>((std::bit_cast<uint32_t>(r) >> 23) & 0xff) - 127;  // <= 0
        const float lo = std::ldexp(1.0f, e);
        code = static_cast<uint32_t>(e + s);
        if (code < levels_ && u < (r - lo) / lo) ++code;
      }
      bits.Write(code | (uint32_t{x[i] < 0} << width), width + 1);
    }
    bits.Finish();
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool*) const override {
    if (in.payload.empty()) return internal::PayloadError(Name(), "truncated header");
    const uint32_t s = in.payload[0];
    if (s == 0 || s > kDitherMaxLevels) {
      return internal::PayloadError(Name(), "levels ", s, " outside [1, ", kDitherMaxLevels, "]");
    }
    TERN_RETURN_IF_ERROR(internal::CheckScales(Name(), in, 1));
    const int width = std::bit_width(s);
    const uint64_t body_bits = in.numel * static_cast<uint64_t>(width + 1);
    if (in.payload.size() - 1 != (body_bits + 7) / 8) {
      return internal::PayloadError(Name(), "expected ", 1 + (body_bits + 7) / 8, " bytes, got ",
                                    in.payload.size());
    }
    std::vector<float> level(s + 1);  // level[c] = norm * 2^(c - s), level[0] = 0
    level[0] = 0;
    for (uint32_t c = 1; c <= s; ++c) {
      level[c] = in.scales[0] * std::ldexp(1.0f, static_cast<int>(c) - static_cast<int>(s));
    }
    // First pass validates every code, so a bad payload leaves `out` untouched.
    for (int pass = 0; pass < 2; ++pass) {
      BitReader bits(in.payload.data() + 1, in.payload.size() - 1);
      for (size_t i = 0; i < in.numel; ++i) {
        uint64_t field = 0;
        bits.Read(width + 1, &field);  // cannot fail: the length was checked
        const uint32_t code = static_cast<uint32_t>(field) & ((1u << width) - 1);
        if (pass == 0) {
          if (code > s) return internal::PayloadError(Name(), "level ", code, " > ", s, " at ", i);
          continue;
        }
        const float v = (field >> width) ? -level[code] : level[code];
        if (accumulate) {
          out[i] += weight * v;
        } else {
          out[i] = v;
        }
      }
      if (pass == 0 && !bits.AtCanonicalEnd()) {
        return internal::PayloadError(Name(), "non-zero padding bits");
      }
    }
    return absl::OkStatus();
  }

 private:
  const uint32_t levels_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewNaturalDitherCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(int64_t levels, params.Int("levels", 8, 1, kDitherMaxLevels));
  return std::make_unique<NaturalDitherCodec>(static_cast<uint32_t>(levels));
}

}  // namespace tern
