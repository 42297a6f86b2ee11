#include "kernels/cuda/gpu_codec.h"

#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/format/payload.h"

namespace tern::cuda {

absl::Status GpuCodec::Decode(const EncodedView& in, float weight, bool accumulate, float* d_out,
                              size_t n, void* d_scratch, size_t scratch_bytes,
                              cudaStream_t stream) const {
  if (absl::Status s = internal::CheckView(Name(), in, n); !s.ok()) return s;
  return DecodeImpl(in, weight, accumulate, d_out, n, d_scratch, scratch_bytes, stream);
}

absl::Status GpuCodec::Encode(const float* d_x, size_t n, const EncodeOptions& options,
                              void* d_scratch, size_t scratch_bytes, cudaStream_t stream,
                              EncodedTensor* out) {
  DeviceEncoded d;
  TERN_RETURN_IF_ERROR(EncodeOnDevice(d_x, n, options, d_scratch, scratch_bytes, stream, &d));
  return CopyToHost(d, stream, out);
}

absl::Status CopyToHost(const DeviceEncoded& in, cudaStream_t stream, EncodedTensor* out) {
  out->codec = in.codec;
  out->params = in.params;
  out->numel = in.numel;
  out->scales.resize(in.num_scales);
  out->payload.resize(in.payload_bytes);
  if (in.num_scales > 0) {
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->scales.data(), in.d_scales,
                                              in.num_scales * sizeof(float), cudaMemcpyDeviceToHost,
                                              stream));
  }
  if (in.payload_bytes > 0) {
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->payload.data(), in.d_payload, in.payload_bytes,
                                              cudaMemcpyDeviceToHost, stream));
  }
  return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

std::unique_ptr<GpuCodecRegistry> NewBuiltinGpuCodecRegistry() {
  auto r = std::make_unique<GpuCodecRegistry>();
  const std::pair<const char*, GpuCodecFactory> all[] = {
      {"none", NewGpuNoneCodec},           {"fp16", NewGpuFp16Codec},
      {"bf16", NewGpuBf16Codec},           {"int8", NewGpuInt8Codec},
      {"sign", NewGpuSignCodec},           {"terngrad", NewGpuTernGradCodec},
      {"natural", NewGpuNaturalCodec},     {"topk", NewGpuTopKCodec},
      {"threshold", NewGpuThresholdCodec}, {"dgc", NewGpuDgcCodec},
      {"randomk", NewGpuRandomKCodec},
  };
  for (const auto& [name, factory] : all) {
    // Construction only parses default parameters; it cannot fail for the built-in set.
    absl::Status s = r->Register(name, factory);
    (void)s;
  }
  return r;
}

}  // namespace tern::cuda
