// qsgd.v1 — QSGD stochastic quantisation with Elias coding. For norm = ||x||_2 and s levels, each
// value becomes sign(x) * norm * l / s with l = floor(s|x|/norm) + Bernoulli(frac), so
// E[decode] = x and Var <= min(d/s^2, sqrt(d)/s) ||x||^2. Non-zeros are coded as Elias-gamma gaps,
// Elias-gamma levels and a sign bit (docs/wire-format.md §qsgd.v1).
#ifndef TERN_KERNELS_CPU_QSGD_H_
#define TERN_KERNELS_CPU_QSGD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: levels s in [1, 2^24], default 16.
absl::StatusOr<std::unique_ptr<Codec>> NewQsgdCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_QSGD_H_
