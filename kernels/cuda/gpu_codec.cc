#include "kernels/cuda/gpu_codec.h"

#include "kernels/format/payload.h"

namespace tern::cuda {

absl::Status GpuCodec::Decode(const EncodedView& in, float weight, bool accumulate, float* d_out,
                              size_t n, void* d_scratch, size_t scratch_bytes,
                              cudaStream_t stream) const {
  if (absl::Status s = internal::CheckView(Name(), in, n); !s.ok()) return s;
  return DecodeImpl(in, weight, accumulate, d_out, n, d_scratch, scratch_bytes, stream);
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
