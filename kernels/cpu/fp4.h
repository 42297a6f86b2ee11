// fp4.v1 — 4-bit floats for outer gradients (Streaming DiLoCo's E3M0, or e2m1): per block of
// `block` values one fp32 scale (the block's max |x|) and a 4-bit code a value, rounded to the
// nearest representable magnitude or stochastically (unbiased). Layout: docs/wire-format.md
// §fp4.v1; the shared format in kernels/format/fp4.h.
#ifndef TERN_KERNELS_CPU_FP4_H_
#define TERN_KERNELS_CPU_FP4_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: block in [1, 2^30], default 128; element=e3m0|e2m1 (default e3m0);
// round=nearest|stochastic (default nearest).
absl::StatusOr<std::unique_ptr<Codec>> NewFp4Codec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_FP4_H_
