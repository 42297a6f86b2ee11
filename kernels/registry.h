// The codec registry: codec factories keyed by name, created from spec strings, and one default
// instance per wire name ("stc.v1") to decode payloads with. No process-wide instance: callers own
// a registry (NewBuiltinCodecRegistry() in kernels/builtin.h fills one with every codec).
//
// Thread-safety: Register must finish before concurrent use; Create and DecoderFor are then
// thread-safe.
#ifndef TERN_KERNELS_REGISTRY_H_
#define TERN_KERNELS_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/codec.h"
#include "kernels/codec_params.h"

namespace tern {

using CodecFactory = std::function<absl::StatusOr<std::unique_ptr<Codec>>(CodecParams&)>;

class CodecRegistry {
 public:
  // Registers `name` (the spec name, e.g. "stc"). The factory must accept empty parameters: that
  // instance decodes every payload of its wire name. Fails on a duplicate name or wire name.
  absl::Status Register(absl::string_view name, CodecFactory factory);

  // Creates a codec from "name" or "name:key=value,...". Unknown names, unknown keys and values
  // out of range are InvalidArgument errors that say what is allowed.
  absl::StatusOr<std::unique_ptr<Codec>> Create(absl::string_view spec) const;

  // Decoder for payloads whose codec field is `wire_name` (e.g. "stc.v1"). The pointer lives as
  // long as the registry.
  absl::StatusOr<const Codec*> DecoderFor(absl::string_view wire_name) const;

  // Decodes any registered codec's payload into `out` / accumulates it.
  absl::Status Decode(const EncodedView& in, absl::Span<float> out) const;
  absl::Status DecodeAccumulate(const EncodedView& in, float weight, absl::Span<float> out) const;

  // Spec names, sorted.
  std::vector<std::string> Names() const;

 private:
  absl::flat_hash_map<std::string, CodecFactory> factories_;
  absl::flat_hash_map<std::string, std::unique_ptr<Codec>> decoders_;  // by wire name
};

}  // namespace tern

#endif  // TERN_KERNELS_REGISTRY_H_
