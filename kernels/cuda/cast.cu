// none.v1, fp16.v1, bf16.v1 on the device: one word per element, converted exactly as the CPU
// codecs convert (kernels/cpu/cast_codec.h).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gpu_codec.h"
#include "kernels/format/cast.h"

namespace tern::cuda {
namespace {

using internal::Arena;

struct NoneWord {
  static constexpr const format::CastFormat& kFormat = format::kNone;
  using Word = uint32_t;
  static __device__ Word Encode(float v) { return __float_as_uint(v); }
  static __device__ float Decode(Word w) { return __uint_as_float(w); }
};
struct Fp16Word {
  static constexpr const format::CastFormat& kFormat = format::kFp16;
  using Word = uint16_t;
  static __device__ Word Encode(float v) { return internal::FloatToHalf(v); }
  static __device__ float Decode(Word w) { return internal::HalfToFloat(w); }
};
struct Bf16Word {
  static constexpr const format::CastFormat& kFormat = format::kBf16;
  using Word = uint16_t;
  static __device__ Word Encode(float v) { return internal::FloatToBfloat16(v); }
  static __device__ float Decode(Word w) { return internal::Bfloat16ToFloat(w); }
};

template <typename T>
__global__ void CastEncodeKernel(const float* x, size_t n, typename T::Word* out) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = T::Encode(x[i]);
  }
}

template <typename T>
__global__ void CastDecodeKernel(const typename T::Word* in, size_t n, float w, bool acc,
                                 float* out) {
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    internal::Store(out, i, T::Decode(in[i]), w, acc);
  }
}

template <typename T>
class GpuCastCodec final : public GpuCodec {
  static_assert(sizeof(typename T::Word) == T::kFormat.word_bytes);

 public:
  absl::string_view Name() const override { return T::kFormat.name; }
  std::string Spec() const override { return T::kFormat.spec; }

  size_t EncodeScratchBytes(size_t n) const override {
    Arena a(nullptr, 0);
    a.Take<typename T::Word>(n);
    return a.used();
  }
  absl::Status EncodeOnDevice(const float* d_x, size_t n, const EncodeOptions&, void* d_scratch,
                              size_t scratch_bytes, cudaStream_t stream,
                              DeviceEncoded* out) override {
    Arena a(d_scratch, scratch_bytes);
    auto* words = a.Take<typename T::Word>(n);
    if (!a.fits()) return internal::ScratchError(Name(), EncodeScratchBytes(n), scratch_bytes);
    if (n > 0) {
      CastEncodeKernel<T><<<internal::GridFor(n), internal::kThreads, 0, stream>>>(d_x, n, words);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("CastEncodeKernel"));
    }
    *out = {.codec = std::string(T::kFormat.name),
            .params = "",
            .numel = n,
            .d_payload = words,
            .payload_bytes = n * sizeof(typename T::Word),
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
    return format::CheckCastPayload(T::kFormat, in);
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate, float* d_out,
                          size_t n, void* d_scratch, size_t scratch_bytes,
                          cudaStream_t stream) const override {
    TERN_RETURN_IF_ERROR(CheckPayload(in));
    // The payload is still in host memory: the CPU decoder's finite check, before any upload.
    if (!in.checked) TERN_RETURN_IF_ERROR(format::CheckCastFinite(T::kFormat, in));
    Arena a(d_scratch, scratch_bytes);
    auto* words = a.Take<typename T::Word>(n);
    if (!a.fits()) return internal::ScratchError(Name(), DecodeScratchBytes(in), scratch_bytes);
    if (n == 0) return absl::OkStatus();
    TERN_RETURN_IF_ERROR(internal::Upload(in, words, stream));
    CastDecodeKernel<T><<<internal::GridFor(n), internal::kThreads, 0, stream>>>(words, n, weight,
                                                                                 accumulate, d_out);
    TERN_RETURN_IF_ERROR(internal::LaunchStatus("CastDecodeKernel"));
    return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuNoneCodec(SpecParams&) {
  return std::make_unique<GpuCastCodec<NoneWord>>();
}
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuFp16Codec(SpecParams&) {
  return std::make_unique<GpuCastCodec<Fp16Word>>();
}
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuBf16Codec(SpecParams&) {
  return std::make_unique<GpuCastCodec<Bf16Word>>();
}

}  // namespace tern::cuda
