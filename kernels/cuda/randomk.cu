// randomk.v1 on the device (kernels/cpu/randomk.cc): the k positions are the first k outputs of
// the keyed Feistel permutation, so each thread computes its own position; no index list exists.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gpu_codec.h"
#include "kernels/format/payload.h"
#include "kernels/format/randomk.h"
#include "kernels/format/sparse.h"

namespace tern::cuda {
namespace {

using internal::Arena;

constexpr size_t kHeaderBytes = format::kRandomKHeaderBytes;
using Permutation = format::RandomKPermutation;

__global__ void RandomKEncodeKernel(const float* x, Permutation perm, uint32_t k, float scale,
                                    float* values) {
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < k;
       j += size_t{gridDim.x} * blockDim.x) {
    values[j] = __fmul_rn(x[perm(static_cast<uint32_t>(j))], scale);
  }
}

__global__ void RandomKDecodeKernel(const float* values, Permutation perm, uint32_t k, float w,
                                    bool acc, float* out) {
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < k;
       j += size_t{gridDim.x} * blockDim.x) {
    internal::Store(out, perm(static_cast<uint32_t>(j)), values[j], w, acc);
  }
}

class GpuRandomKCodec final : public GpuCodec {
 public:
  explicit GpuRandomKCodec(const format::RandomKParams& p) : format_(p), params_(p.Canonical()) {}
  absl::string_view Name() const override { return format::kRandomKName; }
  std::string Spec() const override { return format_.Spec(); }

  size_t EncodeScratchBytes(size_t n) const override {
    Arena a(nullptr, 0);
    a.Take<uint8_t>(kHeaderBytes + 4 * format::SparseK(format_.ratio, n));
    return a.used();
  }
  absl::Status EncodeOnDevice(const float* d_x, size_t n, const EncodeOptions& options,
                              void* d_scratch, size_t scratch_bytes, cudaStream_t stream,
                              DeviceEncoded* out) override {
    const uint32_t k = static_cast<uint32_t>(format::SparseK(format_.ratio, n));
    Arena a(d_scratch, scratch_bytes);
    uint8_t* p = a.Take<uint8_t>(kHeaderBytes + 4 * size_t{k});
    if (!a.fits()) return internal::ScratchError(Name(), EncodeScratchBytes(n), scratch_bytes);
    // Values are 4-aligned at offset 12, after the header.
    float* values = reinterpret_cast<float*>(p + kHeaderBytes);
    const float scale = format_.unbiased ? static_cast<float>(double(n) / k) : 1.0f;
    if (k > 0) {
      RandomKEncodeKernel<<<internal::GridFor(k), internal::kThreads, 0, stream>>>(
          d_x, Permutation::Make(options.seed, n), k, scale, values);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("RandomKEncodeKernel"));
    }
    uint8_t header[kHeaderBytes];
    format::WriteRandomKHeader(options.seed, k, header);
    TERN_RETURN_IF_ERROR(internal::PutHeader(header, kHeaderBytes, p, stream));
    *out = {.codec = std::string(format::kRandomKName),
            .params = params_,
            .numel = n,
            .d_payload = p,
            .payload_bytes = kHeaderBytes + 4 * size_t{k},
            .d_scales = nullptr,
            .num_scales = 0};
    return absl::OkStatus();
  }

  size_t DecodeScratchBytes(const EncodedView& in) const override {
    Arena a(nullptr, 0);
    a.Take<uint8_t>(in.payload.size());
    return a.used();
  }
  absl::Status CheckPayload(const EncodedView& in) const override {
    return format::ReadRandomKHeader(in).status();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate, float* d_out,
                          size_t n, void* d_scratch, size_t scratch_bytes,
                          cudaStream_t stream) const override {
    TERN_ASSIGN_OR_RETURN(const format::RandomKHeader h, format::ReadRandomKHeader(in));
    const uint32_t k = h.k;
    // The payload is still in host memory: the CPU decoder's value check, before any upload.
    TERN_RETURN_IF_ERROR(::tern::internal::CheckF32Values(Name(), h.values, k));
    Arena a(d_scratch, scratch_bytes);
    uint8_t* p = a.Take<uint8_t>(in.payload.size());
    if (!a.fits()) return internal::ScratchError(Name(), DecodeScratchBytes(in), scratch_bytes);
    TERN_RETURN_IF_ERROR(internal::Upload(in, p, stream));
    if (!accumulate && n > 0) {
      TERN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_out, 0, n * sizeof(float), stream));
    }
    if (k > 0) {
      RandomKDecodeKernel<<<internal::GridFor(k), internal::kThreads, 0, stream>>>(
          reinterpret_cast<const float*>(p + kHeaderBytes), Permutation::Make(h.seed, n), k, weight,
          accumulate, d_out);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("RandomKDecodeKernel"));
    }
    return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

 private:
  const format::RandomKParams format_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuRandomKCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::RandomKParams p, format::ParseRandomKParams(params));
  return std::make_unique<GpuRandomKCodec>(p);
}

}  // namespace tern::cuda
