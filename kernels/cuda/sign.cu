// sign.v1 on the device (kernels/cpu/sign.cc): sign bits packed a byte per thread, and each
// chunk's scale ||x_c||_1 / len_c summed in the CPU's fixed order (device_util.cuh).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gpu_codec.h"
#include "kernels/format/sign.h"

namespace tern::cuda {
namespace {

using internal::Arena;

constexpr size_t kHeaderBytes = format::kSignHeaderBytes;

__global__ void PackSignsKernel(const float* x, size_t n, uint8_t* out) {
  const size_t bytes = (n + 7) / 8;
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < bytes;
       j += size_t{gridDim.x} * blockDim.x) {
    unsigned b = 0;
    for (size_t k = 0; k < 8 && 8 * j + k < n; ++k) b |= (__float_as_uint(x[8 * j + k]) >> 31) << k;
    out[j] = static_cast<uint8_t>(b);
  }
}

__global__ void ChunkScalesKernel(const double* totals, size_t n, size_t chunk, float* scales) {
  const size_t nc = (n + chunk - 1) / chunk;
  for (size_t c = size_t{blockIdx.x} * blockDim.x + threadIdx.x; c < nc;
       c += size_t{gridDim.x} * blockDim.x) {
    const size_t len = c * chunk + chunk < n ? chunk : n - c * chunk;
    scales[c] = static_cast<float>(totals[c] / static_cast<double>(len));
  }
}

__global__ void SignDecodeKernel(const uint8_t* bits, size_t n, size_t chunk, const float* scales,
                                 float w, bool acc, float* out) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t neg = (bits[i / 8] >> (i % 8)) & 1u;
    const float v = __uint_as_float(__float_as_uint(scales[i / chunk]) ^ (neg << 31));
    internal::Store(out, i, v, w, acc);
  }
}

class GpuSignCodec final : public GpuCodec {
 public:
  explicit GpuSignCodec(const format::SignParams& p) : format_(p), params_(p.Canonical()) {}
  absl::string_view Name() const override { return format::kSignName; }
  std::string Spec() const override { return format_.Spec(); }

  size_t EncodeScratchBytes(size_t n) const override { return Layout(nullptr, 0, n).used(); }
  absl::Status EncodeOnDevice(const float* d_x, size_t n, const EncodeOptions&, void* d_scratch,
                              size_t scratch_bytes, cudaStream_t stream,
                              DeviceEncoded* out) override {
    Buffers b;
    Arena a = Layout(d_scratch, scratch_bytes, n, &b);
    if (!a.fits()) return internal::ScratchError(Name(), EncodeScratchBytes(n), scratch_bytes);
    const size_t nc = (n + format_.chunk - 1) / format_.chunk;
    if (n > 0) {
      TERN_RETURN_IF_ERROR(internal::SegmentSums<internal::SumOf::kAbs>(
          d_x, n, format_.chunk, b.partial, b.totals, stream));
      ChunkScalesKernel<<<internal::GridFor(nc), internal::kThreads, 0, stream>>>(
          b.totals, n, format_.chunk, b.scales);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("ChunkScalesKernel"));
      PackSignsKernel<<<internal::GridFor((n + 7) / 8), internal::kThreads, 0, stream>>>(d_x, n,
                                                                                         b.bits);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("PackSignsKernel"));
    }
    uint8_t header[kHeaderBytes];
    format::WriteSignHeader(format_, header);
    TERN_RETURN_IF_ERROR(internal::PutHeader(header, kHeaderBytes, b.bits - kHeaderBytes, stream));
    *out = {.codec = std::string(format::kSignName),
            .params = params_,
            .numel = n,
            .d_payload = b.bits - kHeaderBytes,
            .payload_bytes = kHeaderBytes + (n + 7) / 8,
            .d_scales = b.scales,
            .num_scales = nc};
    return absl::OkStatus();
  }

  size_t DecodeScratchBytes(const EncodedView& in) const override {
    Arena a(nullptr, 0);
    a.Take<uint8_t>(in.payload.size());
    a.Take<float>(in.scales.size());
    return a.used();
  }
  absl::Status CheckPayload(const EncodedView& in) const override {
    return format::ReadSignHeader(in).status();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate, float* d_out,
                          size_t n, void* d_scratch, size_t scratch_bytes,
                          cudaStream_t stream) const override {
    TERN_ASSIGN_OR_RETURN(const format::SignHeader h, format::ReadSignHeader(in));
    const uint32_t chunk = h.chunk;
    Arena a(d_scratch, scratch_bytes);
    uint8_t* p = a.Take<uint8_t>(in.payload.size());
    float* scales = a.Take<float>(in.scales.size());
    if (!a.fits()) return internal::ScratchError(Name(), DecodeScratchBytes(in), scratch_bytes);
    if (n == 0) return absl::OkStatus();
    TERN_RETURN_IF_ERROR(internal::Upload(in, p, stream));
    TERN_RETURN_IF_ERROR(internal::UploadFloats(in.scales, scales, stream));
    SignDecodeKernel<<<internal::GridFor(n), internal::kThreads, 0, stream>>>(
        p + kHeaderBytes, n, chunk, scales, weight, accumulate, d_out);
    TERN_RETURN_IF_ERROR(internal::LaunchStatus("SignDecodeKernel"));
    return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

 private:
  struct Buffers {
    float *partial = nullptr, *scales = nullptr;
    double* totals = nullptr;
    uint8_t* bits = nullptr;  // kHeaderBytes after the start of a payload buffer
  };
  Arena Layout(void* base, size_t bytes, size_t n, Buffers* b = nullptr) const {
    Buffers local;
    if (b == nullptr) b = &local;
    const size_t nc = (n + format_.chunk - 1) / format_.chunk;
    Arena a(base, bytes);
    b->partial = a.Take<float>(internal::TotalBlocks(n, format_.chunk));
    b->totals = a.Take<double>(nc);
    b->scales = a.Take<float>(nc);
    uint8_t* payload = a.Take<uint8_t>(kHeaderBytes + (n + 7) / 8);
    b->bits = payload == nullptr ? nullptr : payload + kHeaderBytes;
    return a;
  }

  const format::SignParams format_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuSignCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::SignParams p, format::ParseSignParams(params));
  return std::make_unique<GpuSignCodec>(p);
}

}  // namespace tern::cuda
