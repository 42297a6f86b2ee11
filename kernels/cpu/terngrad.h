// terngrad.v1 — TernGrad: s = max|x| (after optional clipping at clip * sigma), each value becomes
// s * sign(x) * b with b ~ Bernoulli(|x| / s), so E[decode] = x for unclipped values. Ternary codes
// packed 4 per byte (2 bits) or 5 per byte (base 3, log2(3) ~ 1.58 bits per value).
// Layout: docs/wire-format.md §terngrad.v1.
#ifndef TERN_KERNELS_CPU_TERNGRAD_H_
#define TERN_KERNELS_CPU_TERNGRAD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: clip >= 0 (multiples of the standard deviation; 0 disables), default 2.5;
// pack=2bit|base3, default 2bit.
absl::StatusOr<std::unique_ptr<Codec>> NewTernGradCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_TERNGRAD_H_
