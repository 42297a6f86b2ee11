// bf16.v1 — bfloat16, round to nearest even.
// Layout: numel little-endian words, docs/wire-format.md §bf16.v1.
#ifndef TERN_KERNELS_CPU_BF16_H_
#define TERN_KERNELS_CPU_BF16_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// No parameters.
absl::StatusOr<std::unique_ptr<Codec>> NewBf16Codec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_BF16_H_
