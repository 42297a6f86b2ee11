// randomk.v1 on the device (kernels/cpu/randomk.cc): the k positions are the first k outputs of
// the keyed Feistel permutation, so each thread computes its own position; no index list exists.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gpu_codec.h"

namespace tern::cuda {
namespace {

using internal::Arena;

constexpr size_t kHeaderBytes = 12;  // u64 seed | u32 k

struct Permutation {
  RngKey key;
  uint64_t d;
  int half;
  uint32_t mask;

  static Permutation Make(uint64_t seed, uint64_t d) {
    Permutation p;
    p.key = MakeRngKey(seed, /*stream=*/0x52414e44);
    p.d = d;
    int bits = 2;
    if (d > 1) {
      bits = 0;
      for (uint64_t v = d - 1; v != 0; v >>= 1) ++bits;  // std::bit_width(d - 1)
    }
    bits += bits & 1;
    p.half = bits / 2;
    p.mask = (uint32_t{1} << p.half) - 1;
    return p;
  }
  __device__ uint32_t Round(uint32_t x) const {
    uint32_t l = x >> half, r = x & mask;
    for (uint32_t round = 0; round < 4; ++round) {
      const uint32_t f = Random32(key, (uint64_t{round} << 32) | r) & mask;
      const uint32_t nl = r;
      r = l ^ f;
      l = nl;
    }
    return (l << half) | r;
  }
  __device__ uint32_t operator()(uint32_t j) const {
    uint64_t x = j;
    do {
      x = Round(static_cast<uint32_t>(x));
    } while (x >= d);
    return static_cast<uint32_t>(x);
  }
};

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

size_t SparseK(double ratio, size_t d) {  // kernels/cpu/topk.cc
  if (d == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(d));
  return std::clamp<size_t>(static_cast<size_t>(k), 1, d);
}

class GpuRandomKCodec final : public GpuCodec {
 public:
  GpuRandomKCodec(double ratio, bool unbiased)
      : ratio_(ratio),
        unbiased_(unbiased),
        params_(absl::StrCat("ratio=", ratio, ",unbiased=", unbiased ? 1 : 0)) {}
  absl::string_view Name() const override { return "randomk.v1"; }
  std::string Spec() const override { return absl::StrCat("randomk:", params_); }

  size_t EncodeScratchBytes(size_t n) const override {
    Arena a(nullptr, 0);
    a.Take<uint8_t>(kHeaderBytes + 4 * SparseK(ratio_, n));
    return a.used();
  }
  absl::Status Encode(const float* d_x, size_t n, const EncodeOptions& options, void* d_scratch,
                      size_t scratch_bytes, cudaStream_t stream, EncodedTensor* out) override {
    const uint32_t k = static_cast<uint32_t>(SparseK(ratio_, n));
    Arena a(d_scratch, scratch_bytes);
    uint8_t* p = a.Take<uint8_t>(kHeaderBytes + 4 * size_t{k});
    if (!a.fits()) return internal::ScratchError(Name(), EncodeScratchBytes(n), scratch_bytes);
    // Header bytes are written on the host after the copy; values are 4-aligned at offset 12.
    float* values = reinterpret_cast<float*>(p + kHeaderBytes);
    const float scale = unbiased_ ? static_cast<float>(double(n) / k) : 1.0f;
    if (k > 0) {
      RandomKEncodeKernel<<<internal::GridFor(k), internal::kThreads, 0, stream>>>(
          d_x, Permutation::Make(options.seed, n), k, scale, values);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("RandomKEncodeKernel"));
    }
    out->codec = "randomk.v1";
    out->params = params_;
    out->numel = n;
    out->scales.clear();
    TERN_RETURN_IF_ERROR(internal::CopyOut(p, kHeaderBytes + 4 * size_t{k}, stream, &out->payload));
    std::memcpy(out->payload.data(), &options.seed, 8);
    std::memcpy(out->payload.data() + 8, &k, 4);
    return absl::OkStatus();
  }

  size_t DecodeScratchBytes(const EncodedView& in) const override {
    Arena a(nullptr, 0);
    a.Take<uint8_t>(in.payload.size());
    return a.used();
  }
  absl::Status Decode(const EncodedView& in, float weight, bool accumulate, float* d_out, size_t n,
                      void* d_scratch, size_t scratch_bytes, cudaStream_t stream) const override {
    TERN_RETURN_IF_ERROR(internal::CheckView(Name(), in, n));
    if (!in.scales.empty()) return internal::PayloadError(Name(), "expected no scales");
    if (in.payload.size() < kHeaderBytes) return internal::PayloadError(Name(), "truncated header");
    uint64_t seed;
    std::memcpy(&seed, in.payload.data(), 8);
    const uint32_t k = internal::LoadU32(in.payload.data() + 8);
    if (k > n) return internal::PayloadError(Name(), "k = ", k, " exceeds ", n);
    if (in.payload.size() - kHeaderBytes != 4 * uint64_t{k}) {
      return internal::PayloadError(Name(), "k = ", k, " needs ", 4 * uint64_t{k},
                                    " value bytes, got ", in.payload.size() - kHeaderBytes);
    }
    Arena a(d_scratch, scratch_bytes);
    uint8_t* p = a.Take<uint8_t>(in.payload.size());
    if (!a.fits()) return internal::ScratchError(Name(), DecodeScratchBytes(in), scratch_bytes);
    TERN_RETURN_IF_ERROR(internal::Upload(in, p, stream));
    if (!accumulate && n > 0) {
      TERN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_out, 0, n * sizeof(float), stream));
    }
    if (k > 0) {
      RandomKDecodeKernel<<<internal::GridFor(k), internal::kThreads, 0, stream>>>(
          reinterpret_cast<const float*>(p + kHeaderBytes), Permutation::Make(seed, n), k, weight,
          accumulate, d_out);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("RandomKDecodeKernel"));
    }
    return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

 private:
  const double ratio_;
  const bool unbiased_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuRandomKCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(double ratio, params.Double("ratio", 0.01, 1e-9, 1.0));
  TERN_ASSIGN_OR_RETURN(bool unbiased, params.Bool("unbiased", false));
  return std::make_unique<GpuRandomKCodec>(ratio, unbiased);
}

}  // namespace tern::cuda
