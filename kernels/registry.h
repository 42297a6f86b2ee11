// The codec registry: codec factories keyed by name (one Registry<Codec>, common/registry.h),
// created from spec strings, and one default instance per wire name ("stc.v1") to decode
// payloads with. The GPU codecs' registry (kernels/cuda/gpu_codec.h) is the same template over
// GpuCodec. No process-wide instance: callers own a registry (NewBuiltinCodecRegistry() in
// kernels/builtin.h fills one with every codec).
//
// Thread-safety: Register must finish before concurrent use; the const methods are then
// thread-safe.
#ifndef TERN_KERNELS_REGISTRY_H_
#define TERN_KERNELS_REGISTRY_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/registry.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Factories and wire-name decoders of one codec type `C` (Codec, or cuda::GpuCodec): anything
// with Name() (the wire name, "stc.v1").
template <typename C>
class CodecRegistryOf {
 public:
  using Factory = typename Registry<C>::Factory;

  // `kind` names the codecs in errors ("codec", "GPU codec").
  explicit CodecRegistryOf(std::string kind = "codec") : factories_(std::move(kind)) {}

  // Registers `name` (the spec name, e.g. "stc"). The factory must accept empty parameters: that
  // instance decodes every payload of its wire name. Fails on a duplicate name or wire name.
  absl::Status Register(absl::string_view name, Factory factory) {
    SpecParams none;
    absl::StatusOr<std::unique_ptr<C>> decoder = factory(none);
    if (!decoder.ok()) return decoder.status();
    std::string wire((*decoder)->Name());
    if (decoders_.contains(wire)) {
      return absl::AlreadyExistsError(absl::StrCat("wire name '", wire, "' registered twice"));
    }
    if (absl::Status s = factories_.Register(name, std::move(factory)); !s.ok()) return s;
    decoders_.emplace(std::move(wire), *std::move(decoder));
    return absl::OkStatus();
  }

  // Creates a codec from "name" or "name:key=value,...". Unknown names, unknown keys and values
  // out of range are InvalidArgument errors that say what is allowed.
  absl::StatusOr<std::unique_ptr<C>> Create(absl::string_view spec) const {
    return factories_.Create(spec);
  }

  // Decoder for payloads whose codec field is `wire_name` (e.g. "stc.v1"). The pointer lives as
  // long as the registry.
  absl::StatusOr<const C*> DecoderFor(absl::string_view wire_name) const {
    auto it = decoders_.find(wire_name);
    if (it == decoders_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no decoder for codec '", wire_name, "' (unknown codec or version)"));
    }
    return it->second.get();
  }

  bool Has(absl::string_view name) const { return factories_.Has(name); }
  // Spec names, sorted.
  std::vector<std::string> Names() const { return factories_.Names(); }

 private:
  Registry<C> factories_;
  absl::flat_hash_map<std::string, std::unique_ptr<C>> decoders_;  // by wire name
};

using CodecFactory = CodecRegistryOf<Codec>::Factory;

class CodecRegistry final : public CodecRegistryOf<Codec> {
 public:
  // Decodes any registered codec's payload into `out` / accumulates it.
  absl::Status Decode(const EncodedView& in, absl::Span<float> out) const;
  absl::Status DecodeAccumulate(const EncodedView& in, float weight, absl::Span<float> out) const;
  absl::Status DecodeAccumulateEach(const EncodedView& in,
                                    absl::Span<const WeightedTarget> targets) const;
  // Σ_j weights[j] · decode(ins[j]) added to `out` in order: one codec's DecodeAccumulateMany
  // where every payload is of that codec, else each payload's DecodeAccumulate in turn.
  absl::Status DecodeAccumulateMany(absl::Span<const EncodedView> ins,
                                    absl::Span<const float> weights, absl::Span<float> out) const;
  absl::Status Validate(const EncodedView& in) const;
  absl::StatusOr<double> Norm(const EncodedView& in) const;
};

}  // namespace tern

#endif  // TERN_KERNELS_REGISTRY_H_
