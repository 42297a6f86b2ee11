#include "kernels/builtin.h"

#include <cstdlib>

#include "common/status_macros.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/chunk_topk.h"
#include "kernels/cpu/dct.h"
#include "kernels/cpu/dgc.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/fp4.h"
#include "kernels/cpu/hq.h"
#include "kernels/cpu/int8.h"
#include "kernels/cpu/natural.h"
#include "kernels/cpu/natural_dither.h"
#include "kernels/cpu/none.h"
#include "kernels/cpu/powersgd.h"
#include "kernels/cpu/qsgd.h"
#include "kernels/cpu/randomk.h"
#include "kernels/cpu/sign.h"
#include "kernels/cpu/stc.h"
#include "kernels/cpu/terngrad.h"
#include "kernels/cpu/threshold.h"
#include "kernels/cpu/topk.h"
#include "spdlog/spdlog.h"

namespace tern {

absl::Status RegisterBuiltinCodecs(CodecRegistry* registry) {
  TERN_RETURN_IF_ERROR(registry->Register("none", NewNoneCodec));
  TERN_RETURN_IF_ERROR(registry->Register("fp16", NewFp16Codec));
  TERN_RETURN_IF_ERROR(registry->Register("bf16", NewBf16Codec));
  TERN_RETURN_IF_ERROR(registry->Register("int8", NewInt8Codec));
  TERN_RETURN_IF_ERROR(registry->Register("fp4", NewFp4Codec));
  TERN_RETURN_IF_ERROR(registry->Register("topk", NewTopKCodec));
  TERN_RETURN_IF_ERROR(registry->Register("chunk-topk", NewChunkTopKCodec));
  TERN_RETURN_IF_ERROR(registry->Register("dgc", NewDgcCodec));
  TERN_RETURN_IF_ERROR(registry->Register("randomk", NewRandomKCodec));
  TERN_RETURN_IF_ERROR(registry->Register("threshold", NewThresholdCodec));
  TERN_RETURN_IF_ERROR(registry->Register("dct", NewDctCodec));
  TERN_RETURN_IF_ERROR(registry->Register("terngrad", NewTernGradCodec));
  TERN_RETURN_IF_ERROR(registry->Register("qsgd", NewQsgdCodec));
  TERN_RETURN_IF_ERROR(registry->Register("sign", NewSignCodec));
  TERN_RETURN_IF_ERROR(registry->Register("natural", NewNaturalCodec));
  TERN_RETURN_IF_ERROR(registry->Register("natural-dither", NewNaturalDitherCodec));
  TERN_RETURN_IF_ERROR(registry->Register("stc", NewStcCodec));
  TERN_RETURN_IF_ERROR(registry->Register("powersgd", NewPowerSgdCodec));
  TERN_RETURN_IF_ERROR(registry->Register("hq", NewHqCodec));
  return absl::OkStatus();
}

std::unique_ptr<CodecRegistry> NewBuiltinCodecRegistry() {
  auto registry = std::make_unique<CodecRegistry>();
  if (absl::Status s = RegisterBuiltinCodecs(registry.get()); !s.ok()) {
    // Duplicate built-in names are a programming error, not a runtime condition.
    spdlog::critical("built-in codec registration failed: {}", s.ToString());
    std::abort();
  }
  return registry;
}

}  // namespace tern
