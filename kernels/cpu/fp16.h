// fp16.v1 — IEEE binary16, round to nearest even.
// Layout: numel little-endian words, docs/wire-format.md §fp16.v1.
#ifndef TERN_KERNELS_CPU_FP16_H_
#define TERN_KERNELS_CPU_FP16_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// No parameters.
absl::StatusOr<std::unique_ptr<Codec>> NewFp16Codec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_FP16_H_
