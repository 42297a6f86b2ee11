// natural.v1 — natural compression: each value is rounded stochastically to one of the two nearest
// powers of two, sign * 2^floor(log2|x|) or the next power up, with probabilities that make
// E[decode] = x; the second moment grows by at most 9/8. 9 bits per value: an 8-bit exponent code
// and a sign bit. Layout: docs/wire-format.md §natural.v1.
#ifndef TERN_KERNELS_CPU_NATURAL_H_
#define TERN_KERNELS_CPU_NATURAL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// No parameters.
absl::StatusOr<std::unique_ptr<Codec>> NewNaturalCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_NATURAL_H_
