// none.v1, fp16.v1, bf16.v1: one little-endian word per element (4, 2, 2 bytes), no scales, no
// header, no parameters (docs/wire-format.md). Shared by kernels/cpu/cast_codec.h and
// kernels/cuda/cast.cu.
#ifndef TERN_KERNELS_FORMAT_CAST_H_
#define TERN_KERNELS_FORMAT_CAST_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/codec.h"

namespace tern::format {

struct CastFormat {
  const char* name;  // wire name, "fp16.v1"
  const char* spec;  // spec name, "fp16"
  size_t word_bytes;
  uint32_t exponent_mask;  // a word with all these bits set is Inf or NaN
};
inline constexpr CastFormat kNone{"none.v1", "none", 4, 0x7f800000u};
inline constexpr CastFormat kFp16{"fp16.v1", "fp16", 2, 0x7c00u};
inline constexpr CastFormat kBf16{"bf16.v1", "bf16", 2, 0x7f80u};

// No scales and exactly numel words.
absl::Status CheckCastPayload(const CastFormat& f, const EncodedView& in);

// Every word of a (checked) payload in host memory is finite: Inf or NaN is refused before
// anything is written, so a refused payload changes nothing.
absl::Status CheckCastFinite(const CastFormat& f, const EncodedView& in);

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_CAST_H_
