// int8.v1 on the device (kernels/cpu/int8.cc): per-block absmax or min/max (exact reductions),
// then one thread per element quantises with the same float steps and the same counter draws.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gpu_codec.h"
#include "kernels/format/int8.h"

namespace tern::cuda {
namespace {

using internal::Arena;

constexpr size_t kHeaderBytes = format::kInt8HeaderBytes;

// scales and inverse steps per block, as Int8Codec::EncodeBlock computes them.
__global__ void Int8ScalesKernel(const uint32_t* max_abs, const float* lo, const float* hi,
                                 size_t nb, bool minmax, float* scales, float* inv) {
  for (size_t b = size_t{blockIdx.x} * blockDim.x + threadIdx.x; b < nb;
       b += size_t{gridDim.x} * blockDim.x) {
    if (!minmax) {
      const float m = __uint_as_float(max_abs[b]);
      scales[b] = __fdiv_rn(m, 127.0f);
      inv[b] = m > 0 ? __fdiv_rn(127.0f, m) : 0.0f;
    } else {
      const float range = __fsub_rn(hi[b], lo[b]);
      scales[2 * b] = lo[b];
      scales[2 * b + 1] = __fdiv_rn(range, 255.0f);
      inv[b] = hi[b] > lo[b] ? __fdiv_rn(255.0f, range) : 0.0f;
    }
  }
}

__device__ __forceinline__ uint8_t Int8Quantize(float x, uint32_t i, uint32_t b, bool minmax,
                                                bool stochastic, RngKey key, const float* lo,
                                                const float* inv) {
  const float u = stochastic ? Uniform01Lo(key, i) : 0.5f;
  float v = minmax ? __fsub_rn(x, lo[b]) : x;
  v = floorf(__fadd_rn(__fmul_rn(v, inv[b]), u));
  const float top = minmax ? 255.0f : 127.0f, bottom = minmax ? 0.0f : -127.0f;
  v = bottom > (top < v ? top : v) ? bottom : (top < v ? top : v);  // max(bottom, min(top, v))
  return static_cast<uint8_t>(static_cast<int32_t>(v));
}

// Four elements a thread (one 16-byte load where x is aligned), with 32-bit index arithmetic
// when n allows: a 64-bit division per element cost more than the memory traffic.
template <typename Index>
__global__ void Int8QuantizeKernel(const float* x, Index n, uint32_t block, bool minmax,
                                   bool stochastic, RngKey key, const float* lo, const float* inv,
                                   bool aligned, uint8_t* q) {
  const Index stride = Index{gridDim.x} * blockDim.x * 4;
  for (Index i0 = (Index{blockIdx.x} * blockDim.x + threadIdx.x) * 4; i0 < n; i0 += stride) {
    float v[4];
    if (aligned && i0 + 4 <= n) {
      const float4 f = *reinterpret_cast<const float4*>(x + i0);
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = i0 + j < n ? x[i0 + j] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const Index i = i0 + j;
      if (i >= n) break;
      q[i] = Int8Quantize(v[j], static_cast<uint32_t>(i), static_cast<uint32_t>(i / block), minmax,
                          stochastic, key, lo, inv);
    }
  }
}

__global__ void Int8CheckKernel(const uint8_t* q, size_t n, uint32_t* flag) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    if (q[i] == 0x80) atomicOr(flag, 1u);
  }
}

__global__ void Int8DequantizeKernel(const uint8_t* q, size_t n, uint32_t block, bool minmax,
                                     const float* scales, float w, bool acc, float* out) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t b = i / block;
    const float v =
        minmax ? __fadd_rn(scales[2 * b], __fmul_rn(static_cast<float>(q[i]), scales[2 * b + 1]))
               : __fmul_rn(static_cast<float>(static_cast<int8_t>(q[i])), scales[b]);
    internal::Store(out, i, v, w, acc);
  }
}

class GpuInt8Codec final : public GpuCodec {
 public:
  explicit GpuInt8Codec(const format::Int8Params& p) : format_(p), params_(p.Canonical()) {}
  absl::string_view Name() const override { return format::kInt8Name; }
  std::string Spec() const override { return format_.Spec(); }

  size_t EncodeScratchBytes(size_t n) const override { return Layout(nullptr, 0, n).used(); }
  absl::Status EncodeOnDevice(const float* d_x, size_t n, const EncodeOptions& options,
                              void* d_scratch, size_t scratch_bytes, cudaStream_t stream,
                              DeviceEncoded* out) override {
    Buffers b;
    Arena a = Layout(d_scratch, scratch_bytes, n, &b);
    if (!a.fits()) return internal::ScratchError(Name(), EncodeScratchBytes(n), scratch_bytes);
    const size_t nb = (n + format_.block - 1) / format_.block;
    if (n > 0) {
      TERN_RETURN_IF_ERROR(internal::SegmentExtrema(
          d_x, n, format_.block, format_.minmax ? nullptr : b.max_abs,
          format_.minmax ? b.lo : nullptr, format_.minmax ? b.hi : nullptr, stream));
      Int8ScalesKernel<<<internal::GridFor(nb), internal::kThreads, 0, stream>>>(
          b.max_abs, b.lo, b.hi, nb, format_.minmax, b.scales, b.inv);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("Int8ScalesKernel"));
      const bool aligned = reinterpret_cast<uintptr_t>(d_x) % 16 == 0;
      const unsigned grid = internal::GridFor((n + 3) / 4);
      if (n <= (size_t{1} << 31)) {
        Int8QuantizeKernel<uint32_t><<<grid, internal::kThreads, 0, stream>>>(
            d_x, static_cast<uint32_t>(n), format_.block, format_.minmax, format_.stochastic,
            MakeRngKey(options.seed), b.lo, b.inv, aligned, b.q);
      } else {
        Int8QuantizeKernel<size_t><<<grid, internal::kThreads, 0, stream>>>(
            d_x, n, format_.block, format_.minmax, format_.stochastic, MakeRngKey(options.seed),
            b.lo, b.inv, aligned, b.q);
      }
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("Int8QuantizeKernel"));
    }
    // The codes land after a 5-byte gap for the header.
    uint8_t header[kHeaderBytes];
    format::WriteInt8Header(format_, header);
    TERN_RETURN_IF_ERROR(internal::PutHeader(header, kHeaderBytes, b.q - kHeaderBytes, stream));
    *out = {.codec = std::string(format::kInt8Name),
            .params = params_,
            .numel = n,
            .d_payload = b.q - kHeaderBytes,
            .payload_bytes = kHeaderBytes + n,
            .d_scales = b.scales,
            .num_scales = format_.minmax ? 2 * nb : nb};
    return absl::OkStatus();
  }

  size_t DecodeScratchBytes(const EncodedView& in) const override {
    Arena a(nullptr, 0);
    a.Take<uint8_t>(in.payload.size());
    a.Take<float>(in.scales.size());
    a.Take<uint32_t>(1);
    return a.used();
  }
  absl::Status CheckPayload(const EncodedView& in) const override {
    return format::ReadInt8Header(in).status();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate, float* d_out,
                          size_t n, void* d_scratch, size_t scratch_bytes,
                          cudaStream_t stream) const override {
    TERN_ASSIGN_OR_RETURN(const format::Int8Header h, format::ReadInt8Header(in));
    const uint32_t block = h.block;
    Arena a(d_scratch, scratch_bytes);
    uint8_t* p = a.Take<uint8_t>(in.payload.size());
    float* scales = a.Take<float>(in.scales.size());
    uint32_t* d_flag = a.Take<uint32_t>(1);
    if (!a.fits()) return internal::ScratchError(Name(), DecodeScratchBytes(in), scratch_bytes);
    if (n == 0) return absl::OkStatus();
    TERN_RETURN_IF_ERROR(internal::Upload(in, p, stream));
    TERN_RETURN_IF_ERROR(internal::UploadFloats(in.scales, scales, stream));
    if (!h.minmax) {
      TERN_RETURN_IF_ERROR(internal::CheckOnDevice(
          d_flag, stream, "Int8CheckKernel",
          [&] {
            Int8CheckKernel<<<internal::GridFor(n), internal::kThreads, 0, stream>>>(
                p + kHeaderBytes, n, d_flag);
          },
          Name(), "value -128 (byte 0x80)"));
    }
    Int8DequantizeKernel<<<internal::GridFor(n), internal::kThreads, 0, stream>>>(
        p + kHeaderBytes, n, block, h.minmax, scales, weight, accumulate, d_out);
    TERN_RETURN_IF_ERROR(internal::LaunchStatus("Int8DequantizeKernel"));
    return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

 private:
  struct Buffers {
    uint32_t* max_abs = nullptr;
    float *lo = nullptr, *hi = nullptr, *scales = nullptr, *inv = nullptr;
    uint8_t* q = nullptr;  // kHeaderBytes after the start of a payload buffer
  };
  Arena Layout(void* base, size_t bytes, size_t n, Buffers* b = nullptr) const {
    Buffers local;
    if (b == nullptr) b = &local;
    const size_t nb = (n + format_.block - 1) / format_.block;
    Arena a(base, bytes);
    b->max_abs = a.Take<uint32_t>(nb);
    b->lo = a.Take<float>(nb);
    b->hi = a.Take<float>(nb);
    b->scales = a.Take<float>(2 * nb);
    b->inv = a.Take<float>(nb);
    uint8_t* payload = a.Take<uint8_t>(kHeaderBytes + n);
    b->q = payload == nullptr ? nullptr : payload + kHeaderBytes;
    return a;
  }

  const format::Int8Params format_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuInt8Codec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::Int8Params p, format::ParseInt8Params(params));
  return std::make_unique<GpuInt8Codec>(p);
}

}  // namespace tern::cuda
