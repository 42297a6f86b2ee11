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

namespace tern {
namespace {

constexpr size_t kHeaderBytes = 4;  // u32 chunk

constexpr size_t kDecodeBlock = 4096;  // a multiple of 8, so blocks own whole sign bytes

// Decodes n values of one chunk: +scale, sign-flipped where the stored bit is set.
void DecodeChunk(const uint8_t* bits, size_t n, float scale, bool accumulate, float w, float* out) {
  alignas(64) float tmp[kDecodeBlock];
  for (size_t b = 0; b < n; b += kDecodeBlock) {
    const size_t m = std::min(kDecodeBlock, n - b);
    internal::FillSigned(bits + b / 8, m, scale, accumulate ? tmp : out + b);
    if (accumulate) internal::AddScaled(tmp, m, w, out + b);
  }
}

class SignCodec final : public Codec {
 public:
  explicit SignCodec(uint32_t chunk) : chunk_(chunk), params_(absl::StrCat("chunk=", chunk)) {}
  absl::string_view Name() const override { return "sign.v1"; }
  std::string Spec() const override { return absl::StrCat("sign:", params_); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    const size_t nc = (x.size() + chunk_ - 1) / chunk_;
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.resize(nc);
    uint8_t* p = internal::ResizePayload(&out->payload, kHeaderBytes + (x.size() + 7) / 8);
    std::memcpy(p, &chunk_, 4);
    uint8_t* bits = p + kHeaderBytes;
    float* scales = out->scales.data();
    ParallelFor(options.pool, nc, std::max<size_t>(1, (size_t{1} << 16) / chunk_), 1,
                [&](size_t c0, size_t c1) {
                  for (size_t c = c0; c < c1; ++c) {
                    const size_t begin = c * chunk_, n = std::min<size_t>(chunk_, x.size() - begin);
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
    ByteReader r(in.payload.data(), in.payload.size());
    uint32_t chunk;
    if (!r.U32(&chunk)) return internal::PayloadError(Name(), "truncated header");
    if (chunk < 8 || chunk % 8 != 0 || chunk > (1u << 30)) {
      return internal::PayloadError(Name(), "chunk ", chunk,
                                    " is not a multiple of 8 in [8, 2^30]");
    }
    const size_t bytes = (in.numel + 7) / 8;
    if (r.remaining() != bytes) {
      return internal::PayloadError(Name(), "expected ", bytes, " sign bytes, got ", r.remaining());
    }
    const size_t nc = (in.numel + chunk - 1) / chunk;
    TERN_RETURN_IF_ERROR(internal::CheckScales(Name(), in, nc));
    const uint8_t* bits = r.ptr();
    if (in.numel % 8 != 0 && (bits[bytes - 1] >> (in.numel % 8)) != 0) {
      return internal::PayloadError(Name(), "non-zero padding bits");
    }
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
  const uint32_t chunk_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewSignCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(int64_t chunk, params.Int("chunk", 1024, 8, 1 << 30));
  if (chunk % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sign: chunk=", chunk, " must be a multiple of 8"));
  }
  return std::make_unique<SignCodec>(static_cast<uint32_t>(chunk));
}

}  // namespace tern
