// Conversions between the kernels' EncodedTensor and the tern.v1.EncodedTensor message, and
// decoding straight from a received message without copying its payload.
#ifndef TERN_KERNELS_WIRE_H_
#define TERN_KERNELS_WIRE_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/codec.h"
#include "kernels/registry.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// Moves `t` into `msg` (payload and scales are moved, not copied); shape and dtype are left to the
// caller.
void ToProto(EncodedTensor&& t, v1::EncodedTensor* msg);

// A view over `msg`; valid while `msg` is alive and unmodified. Checks that the logical shape, if
// present, multiplies out to numel.
absl::StatusOr<EncodedView> ViewOf(const v1::EncodedTensor& msg);

// Decodes or accumulates a received message with the registry's decoder for its codec.
absl::Status DecodeMessage(const CodecRegistry& registry, const v1::EncodedTensor& msg,
                           absl::Span<float> out);
absl::Status DecodeAccumulateMessage(const CodecRegistry& registry, const v1::EncodedTensor& msg,
                                     float weight, absl::Span<float> out);

}  // namespace tern

#endif  // TERN_KERNELS_WIRE_H_
