#include "kernels/cuda/gpu_codec.h"

namespace tern::cuda {

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
