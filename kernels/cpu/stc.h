// stc.v1 — Sparse Ternary Compression: the exact top-k positions, every kept value replaced by
// sign * mu with mu = mean |kept|; positions as gaps, Rice/Golomb-coded with the parameter
// b* = 1 + floor(log2(ln(phi - 1) / ln(1 - p))), p = k/d, and one sign bit each.
// Layout: docs/wire-format.md §stc.v1.
#ifndef TERN_KERNELS_CPU_STC_H_
#define TERN_KERNELS_CPU_STC_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: ratio in (0, 1], default 0.01.
absl::StatusOr<std::unique_ptr<Codec>> NewStcCodec(SpecParams& params);

// The Golomb parameter b* for k non-zeros among d positions, clamped to [0, 31].
int StcGolombBits(uint64_t k, uint64_t d);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_STC_H_
