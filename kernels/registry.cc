#include "kernels/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tern {

absl::Status CodecRegistry::Register(absl::string_view name, CodecFactory factory) {
  if (factories_.contains(name)) {
    return absl::AlreadyExistsError(absl::StrCat("codec '", name, "' registered twice"));
  }
  CodecParams none;
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Codec> decoder, factory(none));
  std::string wire(decoder->Name());
  if (decoders_.contains(wire)) {
    return absl::AlreadyExistsError(absl::StrCat("wire name '", wire, "' registered twice"));
  }
  decoders_.emplace(std::move(wire), std::move(decoder));
  factories_.emplace(std::string(name), std::move(factory));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Codec>> CodecRegistry::Create(absl::string_view spec) const {
  TERN_ASSIGN_OR_RETURN(auto parsed, CodecParams::ParseSpec(spec));
  auto& [name, params] = parsed;
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown codec '", name, "' (known: ", absl::StrJoin(Names(), ", "), ")"));
  }
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, it->second(params));
  TERN_RETURN_IF_ERROR(params.CheckAllUsed(name));
  return codec;
}

absl::StatusOr<const Codec*> CodecRegistry::DecoderFor(absl::string_view wire_name) const {
  auto it = decoders_.find(wire_name);
  if (it == decoders_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no decoder for codec '", wire_name, "' (unknown codec or version)"));
  }
  return it->second.get();
}

absl::Status CodecRegistry::Decode(const EncodedView& in, absl::Span<float> out) const {
  TERN_ASSIGN_OR_RETURN(const Codec* decoder, DecoderFor(in.codec));
  return decoder->Decode(in, out);
}

absl::Status CodecRegistry::DecodeAccumulate(const EncodedView& in, float weight,
                                             absl::Span<float> out) const {
  TERN_ASSIGN_OR_RETURN(const Codec* decoder, DecoderFor(in.codec));
  return decoder->DecodeAccumulate(in, weight, out);
}

std::vector<std::string> CodecRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, f] : factories_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace tern
