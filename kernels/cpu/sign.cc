#include "kernels/cpu/sign.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/simd.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/format/sign.h"

namespace tern {
namespace {

// Decodes n values of one chunk: +scale, sign-flipped where the stored bit is set; accumulating,
// adds w times that in the same pass (the same bits as decoding first, then adding w times it).
void DecodeChunk(const uint8_t* bits, size_t n, float scale, bool accumulate, float w, float* out) {
  if (accumulate) {
    internal::AddSigned(bits, n, w * scale, out);
  } else {
    internal::FillSigned(bits, n, scale, out);
  }
}

class SignCodec final : public Codec {
 public:
  explicit SignCodec(const format::SignParams& p) : format_(p), params_(p.Canonical()) {}
  absl::string_view Name() const override { return format::kSignName; }
  std::string Spec() const override { return format_.Spec(); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    const size_t nc = (x.size() + format_.chunk - 1) / format_.chunk;
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.resize(nc);
    uint8_t* p =
        internal::ResizePayload(&out->payload, format::kSignHeaderBytes + (x.size() + 7) / 8);
    format::WriteSignHeader(format_, p);
    uint8_t* bits = p + format::kSignHeaderBytes;
    float* scales = out->scales.data();
    ParallelFor(options.pool, nc, std::max<size_t>(1, (size_t{1} << 16) / format_.chunk), 1,
                [&](size_t c0, size_t c1) {
                  for (size_t c = c0; c < c1; ++c) {
                    const size_t begin = c * format_.chunk,
                                 n = std::min<size_t>(format_.chunk, x.size() - begin);
                    const float* xc = x.data() + begin;
                    internal::PackSignBits(xc, n, bits + begin / 8);
                    scales[c] =
                        static_cast<float>(internal::SumAbs(absl::MakeConstSpan(xc, n)) / n);
                  }
                });
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool* pool) const override {
    TERN_ASSIGN_OR_RETURN(const format::SignHeader h, format::ReadSignHeader(in));
    const uint32_t chunk = h.chunk;
    const size_t nc = h.chunks;
    const uint8_t* bits = h.bits;
    ParallelFor(
        pool, nc, std::max<size_t>(1, (size_t{1} << 16) / chunk), 1, [&](size_t c0, size_t c1) {
          for (size_t c = c0; c < c1; ++c) {
            const size_t begin = c * chunk, n = std::min<size_t>(chunk, in.numel - begin);
            DecodeChunk(bits + begin / 8, n, in.scales[c], accumulate, weight, out.data() + begin);
          }
        });
    return absl::OkStatus();
  }

  // Block by block, every payload's block added before the next block: `out`'s block stays in
  // cache across the payloads, so it is read and written once, not once per payload. The same
  // additions in the same order as one payload after another (a block never spans two chunks,
  // and each value's sum is its own).
  absl::Status DecodeAccumulateManyImpl(absl::Span<const EncodedView> ins,
                                        absl::Span<const float> weights,
                                        absl::Span<float> out) const override {
    std::vector<format::SignHeader> h;
    h.reserve(ins.size());
    for (const EncodedView& in : ins) {
      TERN_ASSIGN_OR_RETURN(const format::SignHeader one, format::ReadSignHeader(in));
      if (!h.empty() && one.chunk != h.front().chunk) {
        return Codec::DecodeAccumulateManyImpl(ins, weights, out);
      }
      h.push_back(one);
    }
    if (h.empty()) return absl::OkStatus();
    constexpr size_t kBlock = 8192;  // 32 KiB of out: a first-level cache's worth
    const size_t chunk = h.front().chunk;
    for (size_t c = 0; c < h.front().chunks; ++c) {
      const size_t end = std::min<size_t>((c + 1) * chunk, out.size());
      for (size_t begin = c * chunk; begin < end; begin += kBlock) {
        const size_t n = std::min(kBlock, end - begin);
        for (size_t j = 0; j < ins.size(); ++j) {
          internal::AddSigned(h[j].bits + begin / 8, n, weights[j] * ins[j].scales[c],
                              out.data() + begin);
        }
      }
    }
    return absl::OkStatus();
  }

  // A payload whose header reads decodes (every bit is a sign): nothing to decode to check it.
  absl::Status ValidateImpl(const EncodedView& in) const override {
    return format::ReadSignHeader(in).status();
  }

  // Chunk c decodes to n_c values of magnitude scale_c: the norm from the scales, without the
  // pass over n values the default's decode takes (the norm guard asks for every message's).
  absl::StatusOr<double> NormImpl(const EncodedView& in) const override {
    TERN_ASSIGN_OR_RETURN(const format::SignHeader h, format::ReadSignHeader(in));
    double sum = 0;
    for (size_t c = 0; c < h.chunks; ++c) {
      const size_t n = std::min<size_t>(h.chunk, in.numel - c * h.chunk);
      const double s = in.scales[c];
      sum += static_cast<double>(n) * (s * s);
    }
    return std::sqrt(sum);
  }

 private:
  const format::SignParams format_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewSignCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::SignParams p, format::ParseSignParams(params));
  return std::make_unique<SignCodec>(p);
}

}  // namespace tern
