// none.v1, fp16.v1, bf16.v1: one little-endian word per element (4, 2, 2 bytes), no scales, no
// header, no parameters (docs/wire-format.md). Shared by kernels/cpu/cast_codec.h and
// kernels/cuda/cast.cu.
#ifndef TERN_KERNELS_FORMAT_CAST_H_
#define TERN_KERNELS_FORMAT_CAST_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/codec.h"

namespace tern::format {

struct CastFormat {
  const char* name;  // wire name, "fp16.v1"
  const char* spec;  // spec name, "fp16"
  size_t word_bytes;
};
inline constexpr CastFormat kNone{"none.v1", "none", 4};
inline constexpr CastFormat kFp16{"fp16.v1", "fp16", 2};
inline constexpr CastFormat kBf16{"bf16.v1", "bf16", 2};

// No scales and exactly numel words.
absl::Status CheckCastPayload(const CastFormat& f, const EncodedView& in);

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_CAST_H_
