// bf16.v1 — bfloat16, round to nearest even.
// Layout: numel little-endian words, docs/wire-format.md §bf16.v1.
#ifndef TERN_KERNELS_CPU_BF16_H_
#define TERN_KERNELS_CPU_BF16_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/codec.h"
#include "kernels/codec_params.h"

namespace tern {

// No parameters.
absl::StatusOr<std::unique_ptr<Codec>> NewBf16Codec(CodecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_BF16_H_
