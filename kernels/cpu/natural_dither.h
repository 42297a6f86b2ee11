// natural-dither.v1 — natural dithering: with norm = ||x||_2 and s levels, |x| / norm is rounded
// stochastically between the neighbouring levels of {0, 2^(1-s), ..., 1/2, 1}, unbiased. Each value
// costs bit_width(s) + 1 bits. Layout: docs/wire-format.md §natural-dither.v1.
#ifndef TERN_KERNELS_CPU_NATURAL_DITHER_H_
#define TERN_KERNELS_CPU_NATURAL_DITHER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: levels s in [1, 30], default 8.
absl::StatusOr<std::unique_ptr<Codec>> NewNaturalDitherCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_NATURAL_DITHER_H_
