#include "kernels/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tern {

absl::Status CodecRegistry::Decode(const EncodedView& in, absl::Span<float> out) const {
  TERN_ASSIGN_OR_RETURN(const Codec* decoder, DecoderFor(in.codec));
  return decoder->Decode(in, out);
}

absl::Status CodecRegistry::Validate(const EncodedView& in) const {
  TERN_ASSIGN_OR_RETURN(const Codec* decoder, DecoderFor(in.codec));
  return decoder->Validate(in);
}

absl::StatusOr<double> CodecRegistry::Norm(const EncodedView& in) const {
  TERN_ASSIGN_OR_RETURN(const Codec* decoder, DecoderFor(in.codec));
  return decoder->Norm(in);
}

absl::Status CodecRegistry::DecodeAccumulate(const EncodedView& in, float weight,
                                             absl::Span<float> out) const {
  TERN_ASSIGN_OR_RETURN(const Codec* decoder, DecoderFor(in.codec));
  return decoder->DecodeAccumulate(in, weight, out);
}

absl::Status CodecRegistry::DecodeAccumulateEach(const EncodedView& in,
                                                 absl::Span<const WeightedTarget> targets) const {
  TERN_ASSIGN_OR_RETURN(const Codec* decoder, DecoderFor(in.codec));
  return decoder->DecodeAccumulateEach(in, targets);
}

absl::Status CodecRegistry::DecodeAccumulateMany(absl::Span<const EncodedView> ins,
                                                 absl::Span<const float> weights,
                                                 absl::Span<float> out) const {
  if (weights.size() != ins.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ins.size(), " payloads and ", weights.size(), " weights"));
  }
  if (ins.empty()) return absl::OkStatus();
  const bool one_codec = std::all_of(
      ins.begin(), ins.end(), [&](const EncodedView& v) { return v.codec == ins.front().codec; });
  if (one_codec) {
    TERN_ASSIGN_OR_RETURN(const Codec* decoder, DecoderFor(ins.front().codec));
    return decoder->DecodeAccumulateMany(ins, weights, out);
  }
  for (size_t j = 0; j < ins.size(); ++j) {
    TERN_RETURN_IF_ERROR(DecodeAccumulate(ins[j], weights[j], out));
  }
  return absl::OkStatus();
}

}  // namespace tern
