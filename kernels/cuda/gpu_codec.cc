#include "kernels/cuda/gpu_codec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tern::cuda {

absl::Status GpuCodecRegistry::Register(absl::string_view name, GpuCodecFactory factory) {
  CodecParams none;
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<GpuCodec> decoder, factory(none));
  std::string wire(decoder->Name());
  if (factories_.contains(name) || decoders_.contains(wire)) {
    return absl::AlreadyExistsError(absl::StrCat("GPU codec '", name, "' registered twice"));
  }
  decoders_.emplace(std::move(wire), std::move(decoder));
  factories_.emplace(std::string(name), std::move(factory));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GpuCodec>> GpuCodecRegistry::Create(absl::string_view spec) const {
  TERN_ASSIGN_OR_RETURN(auto parsed, CodecParams::ParseSpec(spec));
  auto& [name, params] = parsed;
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no GPU codec '", name, "' (GPU codecs: ", absl::StrJoin(Names(), ", "), ")"));
  }
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<GpuCodec> codec, it->second(params));
  TERN_RETURN_IF_ERROR(params.CheckAllUsed(name));
  return codec;
}

absl::StatusOr<const GpuCodec*> GpuCodecRegistry::DecoderFor(absl::string_view wire_name) const {
  auto it = decoders_.find(wire_name);
  if (it == decoders_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("no GPU decoder for codec '", wire_name, "'"));
  }
  return it->second.get();
}

std::vector<std::string> GpuCodecRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, f] : factories_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
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
