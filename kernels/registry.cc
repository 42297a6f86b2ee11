#include "kernels/registry.h"

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

}  // namespace tern
