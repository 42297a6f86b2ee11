// terngrad.v1 on the device (kernels/cpu/terngrad.cc): the scale from the exact max |x| or, with
// clipping, from the moments summed in the CPU's order; then one thread per packed byte draws
// its 4 (2-bit) or 5 (base-3) ternary digits from the counter generator.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gpu_codec.h"
#include "kernels/format/terngrad.h"

namespace tern::cuda {
namespace {

using internal::Arena;

constexpr uint8_t k2Bit = format::kTernGrad2Bit;

// s as TernGradCodec::Encode computes it; scale[0] = s, scale[1] = 1 / s (or 0).
__global__ void TernScaleKernel(const double* sum, const double* sum_sq, const uint32_t* max_abs,
                                size_t n, double clip, float* scale) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const float m = __uint_as_float(*max_abs);
  float s = m;
  if (clip > 0 && n > 0) {
    const double mean = *sum / static_cast<double>(n);
    const double var0 = *sum_sq / static_cast<double>(n) - mean * mean;
    const double var = 0.0 > var0 ? 0.0 : var0;  // std::max(0.0, var0)
    const float c = static_cast<float>(clip * sqrt(var));
    s = c < m ? c : m;  // std::min(m, c)
  }
  scale[0] = s;
  scale[1] = s > 0 ? __fdiv_rn(1.0f, s) : 0.0f;
}

__device__ __forceinline__ unsigned Digit(float v, size_t i, RngKey key, float s, float inv) {
  const float a = fabsf(v) < s ? fabsf(v) : s;
  const unsigned keep = Uniform01Lo(key, static_cast<uint32_t>(i)) < __fmul_rn(a, inv);
  const unsigned neg = v < 0;
  return keep + (keep & neg);
}

__global__ void TernPackKernel(const float* x, size_t n, uint8_t pack, RngKey key,
                               const float* scale, bool aligned, uint8_t* out) {
  const float s = scale[0], inv = scale[1];
  const size_t per = pack == k2Bit ? 4 : 5;
  const size_t bytes = (n + per - 1) / per;
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < bytes;
       j += size_t{gridDim.x} * blockDim.x) {
    unsigned b = 0, mul = 1;
    if (pack == k2Bit && aligned && 4 * j + 4 <= n) {  // one 16-byte load for the byte's four
      const float4 v = *reinterpret_cast<const float4*>(x + 4 * j);
      b = Digit(v.x, 4 * j, key, s, inv) | Digit(v.y, 4 * j + 1, key, s, inv) << 2 |
          Digit(v.z, 4 * j + 2, key, s, inv) << 4 | Digit(v.w, 4 * j + 3, key, s, inv) << 6;
      out[j] = static_cast<uint8_t>(b);
      continue;
    }
    for (size_t k = 0; k < per && per * j + k < n; ++k) {
      const unsigned t = Digit(x[per * j + k], per * j + k, key, s, inv);
      if (pack == k2Bit) {
        b |= t << (2 * k);
      } else {
        b += t * mul;
        mul *= 3;
      }
    }
    out[j] = static_cast<uint8_t>(b);
  }
}

__global__ void TernCheckKernel(const uint8_t* body, size_t bytes, uint8_t pack, uint32_t* flag) {
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < bytes;
       j += size_t{gridDim.x} * blockDim.x) {
    const unsigned b = body[j];
    const bool bad = pack == k2Bit ? (((b & 0x55u) & ((b >> 1) & 0x55u)) != 0) : b >= 243;
    if (bad) atomicOr(flag, 1u);
  }
}

__global__ void TernDecodeKernel(const uint8_t* body, size_t n, uint8_t pack, float s, float w,
                                 bool acc, float* out) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    unsigned t;
    if (pack == k2Bit) {
      t = (body[i / 4] >> (2 * (i % 4))) & 3u;
    } else {
      t = body[i / 5];
      for (size_t k = 0; k < i % 5; ++k) t /= 3;
      t %= 3;
    }
    const float v = t == 1 ? s : (t == 2 ? -s : 0.0f);
    internal::Store(out, i, v, w, acc);
  }
}

class GpuTernGradCodec final : public GpuCodec {
 public:
  explicit GpuTernGradCodec(const format::TernGradParams& p) : format_(p), params_(p.Canonical()) {}
  absl::string_view Name() const override { return format::kTernGradName; }
  std::string Spec() const override { return format_.Spec(); }

  size_t EncodeScratchBytes(size_t n) const override { return Layout(nullptr, 0, n).used(); }
  absl::Status EncodeOnDevice(const float* d_x, size_t n, const EncodeOptions& options,
                              void* d_scratch, size_t scratch_bytes, cudaStream_t stream,
                              DeviceEncoded* out) override {
    Buffers b;
    Arena a = Layout(d_scratch, scratch_bytes, n, &b);
    if (!a.fits()) return internal::ScratchError(Name(), EncodeScratchBytes(n), scratch_bytes);
    const size_t segment = n > 0 ? n : 1;
    TERN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b.max_abs, 0, 4, stream));
    if (n > 0 && format_.clip > 0) {
      // One pass for the largest |x| and both moments' block sums.
      const size_t blocks = internal::TotalBlocks(n, segment);
      internal::MomentsKernel<<<internal::GridFor((blocks + 1) / 2 * 32), internal::kThreads, 0,
                                stream>>>(d_x, n, blocks, b.partial, b.partial_sq, b.max_abs);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("MomentsKernel"));
      TERN_RETURN_IF_ERROR(internal::SegmentTotals(
          {.partial = {b.partial, b.partial_sq}, .total = {b.sum, b.sum_sq}}, 2, n, segment,
          stream));
    } else if (n > 0) {
      internal::MaxAbsKernel<<<internal::GridFor(n), internal::kThreads, 0, stream>>>(d_x, n,
                                                                                      b.max_abs);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("MaxAbsKernel"));
    }
    TernScaleKernel<<<1, 1, 0, stream>>>(b.sum, b.sum_sq, b.max_abs, n, n > 0 ? format_.clip : 0.0,
                                         b.scale);
    TERN_RETURN_IF_ERROR(internal::LaunchStatus("TernScaleKernel"));
    const size_t bytes = format::TernGradPackedBytes(format_.pack, n);
    if (n > 0) {
      TernPackKernel<<<internal::GridFor(bytes), internal::kThreads, 0, stream>>>(
          d_x, n, format_.pack, MakeRngKey(options.seed), b.scale,
          reinterpret_cast<uintptr_t>(d_x) % 16 == 0, b.body);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("TernPackKernel"));
    }
    const uint8_t header[1] = {static_cast<uint8_t>(format_.pack)};
    TERN_RETURN_IF_ERROR(internal::PutHeader(header, 1, b.body - 1, stream));
    *out = {.codec = std::string(format::kTernGradName),
            .params = params_,
            .numel = n,
            .d_payload = b.body - 1,
            .payload_bytes = 1 + bytes,
            .d_scales = b.scale,
            .num_scales = 1};
    return absl::OkStatus();
  }

  size_t DecodeScratchBytes(const EncodedView& in) const override {
    Arena a(nullptr, 0);
    a.Take<uint8_t>(in.payload.size());
    a.Take<uint32_t>(1);
    return a.used();
  }
  absl::Status CheckPayload(const EncodedView& in) const override {
    return format::ReadTernGradHeader(in).status();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate, float* d_out,
                          size_t n, void* d_scratch, size_t scratch_bytes,
                          cudaStream_t stream) const override {
    TERN_ASSIGN_OR_RETURN(const format::TernGradHeader h, format::ReadTernGradHeader(in));
    const uint8_t pack = h.pack;
    const size_t bytes = h.bytes;
    Arena a(d_scratch, scratch_bytes);
    uint8_t* p = a.Take<uint8_t>(in.payload.size());
    uint32_t* d_flag = a.Take<uint32_t>(1);
    if (!a.fits()) return internal::ScratchError(Name(), DecodeScratchBytes(in), scratch_bytes);
    if (n == 0) return absl::OkStatus();
    TERN_RETURN_IF_ERROR(internal::Upload(in, p, stream));
    TERN_RETURN_IF_ERROR(internal::CheckOnDevice(
        d_flag, stream, "TernCheckKernel",
        [&] {
          TernCheckKernel<<<internal::GridFor(bytes), internal::kThreads, 0, stream>>>(
              p + 1, bytes, pack, d_flag);
        },
        Name(), pack == k2Bit ? "invalid 2-bit code 3" : "byte >= 3^5"));
    TernDecodeKernel<<<internal::GridFor(n), internal::kThreads, 0, stream>>>(
        p + 1, n, pack, in.scales[0], weight, accumulate, d_out);
    TERN_RETURN_IF_ERROR(internal::LaunchStatus("TernDecodeKernel"));
    return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

 private:
  struct Buffers {
    float *partial = nullptr, *partial_sq = nullptr, *scale = nullptr;
    double *sum = nullptr, *sum_sq = nullptr;
    uint32_t* max_abs = nullptr;
    uint8_t* body = nullptr;  // 1 byte after the start of a payload buffer
  };
  Arena Layout(void* base, size_t bytes, size_t n, Buffers* b = nullptr) const {
    Buffers local;
    if (b == nullptr) b = &local;
    Arena a(base, bytes);
    b->partial = a.Take<float>(internal::TotalBlocks(n, n > 0 ? n : 1));
    b->partial_sq = a.Take<float>(internal::TotalBlocks(n, n > 0 ? n : 1));
    b->sum = a.Take<double>(1);
    b->sum_sq = a.Take<double>(1);
    b->max_abs = a.Take<uint32_t>(1);
    b->scale = a.Take<float>(2);
    uint8_t* payload = a.Take<uint8_t>(1 + format::TernGradPackedBytes(format_.pack, n));
    b->body = payload == nullptr ? nullptr : payload + 1;
    return a;
  }

  const format::TernGradParams format_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuTernGradCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::TernGradParams p, format::ParseTernGradParams(params));
  return std::make_unique<GpuTernGradCodec>(p);
}

}  // namespace tern::cuda
