// natural.v1 on the device (kernels/cpu/natural.cc): one thread per element rounds the exponent
// up with probability mantissa / 2^23 from the counter generator; sign bits a byte per thread.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gpu_codec.h"
#include "kernels/format/natural.h"

namespace tern::cuda {
namespace {

using internal::Arena;

// Eight elements a thread: their codes as one 8-byte store and their sign byte (a thread per
// element, with every eighth reading eight floats again for the signs, ran at 17 % of DRAM).
__global__ void NaturalEncodeKernel(const float* x, size_t n, RngKey key, bool aligned,
                                    uint8_t* codes, uint8_t* signs, uint32_t* nonfinite) {
  for (size_t i0 = (size_t{blockIdx.x} * blockDim.x + threadIdx.x) * 8; i0 < n;
       i0 += size_t{gridDim.x} * blockDim.x * 8) {
    uint32_t bits[8];
    if (aligned && i0 + 8 <= n) {
      const float4 a = *reinterpret_cast<const float4*>(x + i0);
      const float4 b = *reinterpret_cast<const float4*>(x + i0 + 4);
      bits[0] = __float_as_uint(a.x), bits[1] = __float_as_uint(a.y);
      bits[2] = __float_as_uint(a.z), bits[3] = __float_as_uint(a.w);
      bits[4] = __float_as_uint(b.x), bits[5] = __float_as_uint(b.y);
      bits[6] = __float_as_uint(b.z), bits[7] = __float_as_uint(b.w);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) bits[k] = i0 + k < n ? __float_as_uint(x[i0 + k]) : 0u;
    }
    uint8_t code[8];
    unsigned sign = 0, bad = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t e = (bits[k] >> 23) & 0xff;
      const uint32_t mant = bits[k] & 0x7fffff;
      const uint32_t up =
          ((Random32Lo(key, static_cast<uint32_t>(i0 + k)) >> 9) < mant) & (e < 254 ? 1u : 0u);
      code[k] = static_cast<uint8_t>(e + up);
      bad |= e == 255;
      sign |= (bits[k] >> 31) << k;
    }
    if (i0 + 8 <= n) {
      uint2 word;
      memcpy(&word, code, 8);
      *reinterpret_cast<uint2*>(codes + i0) = word;
    } else {
      for (size_t k = 0; i0 + k < n; ++k) codes[i0 + k] = code[k];
    }
    signs[i0 / 8] = static_cast<uint8_t>(sign);
    if (bad) atomicOr(nonfinite, 1u);
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
  absl::Status EncodeOnDevice(const float* d_x, size_t n, const EncodeOptions& options,
                              void* d_scratch, size_t scratch_bytes, cudaStream_t stream,
                              DeviceEncoded* out) override {
    Arena a(d_scratch, scratch_bytes);
    uint8_t* p = a.Take<uint8_t>(n + (n + 7) / 8);
    uint32_t* d_flag = a.Take<uint32_t>(1);
    if (!a.fits()) return internal::ScratchError(Name(), EncodeScratchBytes(n), scratch_bytes);
    TERN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_flag, 0, 4, stream));
    if (n > 0) {
      NaturalEncodeKernel<<<internal::GridFor((n + 7) / 8), internal::kThreads, 0, stream>>>(
          d_x, n, MakeRngKey(options.seed), reinterpret_cast<uintptr_t>(d_x) % 16 == 0, p, p + n,
          d_flag);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("NaturalEncodeKernel"));
    }
    *out = {.codec = std::string(format::kNaturalName),
            .params = "",
            .numel = n,
            .d_payload = p,
            .payload_bytes = n + (n + 7) / 8,
            .d_scales = nullptr,
            .num_scales = 0};
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
