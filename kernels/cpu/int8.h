// int8.v1 — blockwise 8-bit quantisation. Per block of `block` values either a symmetric absmax
// scale (q in [-127, 127], x ~ q * scale) or a min-max affine map (q in [0, 255],
// x ~ lo + q * step); rounding to nearest or stochastic (unbiased).
// Layout: docs/wire-format.md §int8.v1.
#ifndef TERN_KERNELS_CPU_INT8_H_
#define TERN_KERNELS_CPU_INT8_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: block in [1, 2^20], default 1024; mode=absmax|minmax (default absmax);
// round=nearest|stochastic (default nearest).
absl::StatusOr<std::unique_ptr<Codec>> NewInt8Codec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_INT8_H_
