#include "kernels/cpu/sign.h"

#include <algorithm>
#include <bit>
#include <cstring>

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
