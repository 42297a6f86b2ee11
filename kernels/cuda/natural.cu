// natural.v1 on the device (kernels/cpu/natural.cc): one thread per element rounds the exponent
// up with probability mantissa / 2^23 from the counter generator; sign bits a byte per thread.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gpu_codec.h"
#include "kernels/format/natural.h"

namespace tern::cuda {
namespace {

using internal::Arena;

__global__ void NaturalEncodeKernel(const float* x, size_t n, RngKey key, uint8_t* codes,
                                    uint8_t* signs, uint32_t* nonfinite) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t bits = __float_as_uint(x[i]);
    const uint32_t e = (bits >> 23) & 0xff;
    const uint32_t mant = bits & 0x7fffff;
    const uint32_t up =
        ((Random32Lo(key, static_cast<uint32_t>(i)) >> 9) < mant) & (e < 254 ? 1u : 0u);
    codes[i] = static_cast<uint8_t>(e + up);
    if (e == 255) atomicOr(nonfinite, 1u);
    if (i % 8 == 0) {
      unsigned b = 0;
      for (size_t k = 0; k < 8 && i + k < n; ++k) b |= (__float_as_uint(x[i + k]) >> 31) << k;
      signs[i / 8] = static_cast<uint8_t>(b);
    }
  }
}

__global__ void NaturalCheckKernel(const uint8_t* codes, size_t n, uint32_t* flag) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    if (codes[i] == 0xff) atomicOr(flag, 1u);
  }
}

__global__ void NaturalDecodeKernel(const uint8_t* codes, const uint8_t* signs, size_t n, float w,
                                    bool acc, float* out) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float v =
        __uint_as_float(uint32_t{codes[i]} << 23 | uint32_t{(signs[i / 8] >> (i % 8)) & 1u} << 31);
    internal::Store(out, i, v, w, acc);
  }
}

class GpuNaturalCodec final : public GpuCodec {
 public:
  absl::string_view Name() const override { return format::kNaturalName; }
  std::string Spec() const override { return format::kNaturalSpec; }

  size_t EncodeScratchBytes(size_t n) const override {
    Arena a(nullptr, 0);
    a.Take<uint8_t>(n + (n + 7) / 8);
    a.Take<uint32_t>(1);
    return a.used();
  }
  absl::Status Encode(const float* d_x, size_t n, const EncodeOptions& options, void* d_scratch,
                      size_t scratch_bytes, cudaStream_t stream, EncodedTensor* out) override {
    Arena a(d_scratch, scratch_bytes);
    uint8_t* p = a.Take<uint8_t>(n + (n + 7) / 8);
    uint32_t* d_flag = a.Take<uint32_t>(1);
    if (!a.fits()) return internal::ScratchError(Name(), EncodeScratchBytes(n), scratch_bytes);
    TERN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_flag, 0, 4, stream));
    if (n > 0) {
      NaturalEncodeKernel<<<internal::GridFor(n), internal::kThreads, 0, stream>>>(
          d_x, n, MakeRngKey(options.seed), p, p + n, d_flag);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("NaturalEncodeKernel"));
    }
    out->codec = format::kNaturalName;
    out->params.clear();
    out->numel = n;
    out->scales.clear();
    TERN_RETURN_IF_ERROR(internal::CopyOut(p, n + (n + 7) / 8, stream, &out->payload));
    uint32_t flag = 0;
    TERN_RETURN_IF_ERROR(internal::ReadFlag(d_flag, stream, &flag));
    if (flag != 0) return absl::InvalidArgumentError("natural: input holds Inf or NaN");
    return absl::OkStatus();
  }

  size_t DecodeScratchBytes(const EncodedView& in) const override {
    Arena a(nullptr, 0);
    a.Take<uint8_t>(in.payload.size());
    a.Take<uint32_t>(1);
    return a.used();
  }
  absl::Status CheckPayload(const EncodedView& in) const override {
    return format::ReadNaturalHeader(in).status();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate, float* d_out,
                          size_t n, void* d_scratch, size_t scratch_bytes,
                          cudaStream_t stream) const override {
    TERN_RETURN_IF_ERROR(CheckPayload(in));
    Arena a(d_scratch, scratch_bytes);
    uint8_t* p = a.Take<uint8_t>(in.payload.size());
    uint32_t* d_flag = a.Take<uint32_t>(1);
    if (!a.fits()) return internal::ScratchError(Name(), DecodeScratchBytes(in), scratch_bytes);
    if (n == 0) return absl::OkStatus();
    TERN_RETURN_IF_ERROR(internal::Upload(in, p, stream));
    TERN_RETURN_IF_ERROR(internal::CheckOnDevice(
        d_flag, stream, "NaturalCheckKernel",
        [&] {
          NaturalCheckKernel<<<internal::GridFor(n), internal::kThreads, 0, stream>>>(p, n, d_flag);
        },
        Name(), "exponent code 255"));
    NaturalDecodeKernel<<<internal::GridFor(n), internal::kThreads, 0, stream>>>(
        p, p + n, n, weight, accumulate, d_out);
    TERN_RETURN_IF_ERROR(internal::LaunchStatus("NaturalDecodeKernel"));
    return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuNaturalCodec(SpecParams&) {
  return std::make_unique<GpuNaturalCodec>();
}

}  // namespace tern::cuda
