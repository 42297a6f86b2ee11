// Shared body of the element-wise "cast" codecs (none, fp16, bf16): the payload is numel words of
// Traits::Word, little-endian, nothing else. Each codec's .cc supplies its traits and hot loops.
// Internal to kernels/.
#ifndef TERN_KERNELS_CPU_CAST_CODEC_H_
#define TERN_KERNELS_CPU_CAST_CODEC_H_

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "kernels/codec.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/format/cast.h"

namespace tern::internal {

// Traits: kFormat (kernels/format/cast.h), kLossless,
//   static void EncodeLoop(const float* x, uint8_t* out, size_t n);
//   static void DecodeLoop(const uint8_t* in, float* out, size_t n);          // overwrite
//   static void AccumulateLoop(const uint8_t* in, float w, float* out, size_t n);
template <typename Traits>
class CastCodec final : public Codec {
 public:
  absl::string_view Name() const override { return Traits::kFormat.name; }
  std::string Spec() const override { return Traits::kFormat.spec; }
  bool lossless() const override { return Traits::kLossless; }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    if (absl::Status s = CheckNumel(Name(), x.size()); !s.ok()) return s;
    SetHeader(*this, "", x.size(), out);
    out->scales.clear();
    uint8_t* p = ResizePayload(&out->payload, x.size() * Traits::kFormat.word_bytes);
    ParallelFor(options.pool, x.size(), kGrain, 64, [&](size_t b, size_t e) {
      Traits::EncodeLoop(x.data() + b, p + b * Traits::kFormat.word_bytes, e - b);
    });
    return absl::OkStatus();
  }

 protected:
  // A cast payload is valid when its size matches and every word is finite: no decode needed.
  absl::Status ValidateImpl(const EncodedView& in) const override {
    if (absl::Status s = format::CheckCastPayload(Traits::kFormat, in); !s.ok()) return s;
    return format::CheckCastFinite(Traits::kFormat, in);
  }

  // Decoded a block at a time on the stack: no tensor-sized scratch, and one pass (Inf or NaN
  // anywhere makes the sum non-finite, which is the finiteness check).
  absl::StatusOr<double> NormImpl(const EncodedView& in) const override {
    if (absl::Status s = format::CheckCastPayload(Traits::kFormat, in); !s.ok()) return s;
    constexpr size_t kBlock = 1024;
    float block[kBlock];
    double sum = 0;
    for (size_t b = 0; b < in.numel; b += kBlock) {
      const size_t n = std::min(kBlock, static_cast<size_t>(in.numel) - b);
      Traits::DecodeLoop(in.payload.data() + b * Traits::kFormat.word_bytes, block, n);
      sum += SquaredL2Norm(absl::MakeConstSpan(block, n));
    }
    if (!std::isfinite(sum)) return format::CheckCastFinite(Traits::kFormat, in);
    return std::sqrt(sum);
  }

  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool* pool) const override {
    if (absl::Status s = format::CheckCastPayload(Traits::kFormat, in); !s.ok()) return s;
    if (absl::Status s = format::CheckCastFinite(Traits::kFormat, in); !s.ok()) return s;
    const uint8_t* p = in.payload.data();
    ParallelFor(pool, out.size(), kGrain, 64, [&](size_t b, size_t e) {
      if (accumulate) {
        Traits::AccumulateLoop(p + b * Traits::kFormat.word_bytes, weight, out.data() + b, e - b);
      } else {
        Traits::DecodeLoop(p + b * Traits::kFormat.word_bytes, out.data() + b, e - b);
      }
    });
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kGrain = size_t{1} << 16;
};

}  // namespace tern::internal

#endif  // TERN_KERNELS_CPU_CAST_CODEC_H_
