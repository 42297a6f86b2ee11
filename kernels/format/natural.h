// natural.v1's wire format (docs/wire-format.md §natural.v1), shared by kernels/cpu/natural.cc
// and kernels/cuda/natural.cu: numel exponent codes (u8, 255 refused) | ceil(numel / 8) sign
// bytes (zero padding); no scales, no parameters.
#ifndef TERN_KERNELS_FORMAT_NATURAL_H_
#define TERN_KERNELS_FORMAT_NATURAL_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/codec.h"

namespace tern::format {

inline constexpr char kNaturalName[] = "natural.v1";
inline constexpr char kNaturalSpec[] = "natural";

struct NaturalHeader {
  const uint8_t* codes = nullptr;  // numel bytes, not yet checked (255 refused)
  const uint8_t* signs = nullptr;  // ceil(numel / 8) bytes, padding checked
  size_t sign_bytes = 0;
};
// Scales, sizes and the sign padding; the decoder checks the codes.
absl::StatusOr<NaturalHeader> ReadNaturalHeader(const EncodedView& in);

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_NATURAL_H_
