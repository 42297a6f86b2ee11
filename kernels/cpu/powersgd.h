// powersgd.v2 — PowerSGD: each tensor of the input (EncodeOptions::blocks, or the one tensor of
// EncodeOptions::shape) viewed as a [rows, numel / rows] matrix M, as PyTorch's hook views a
// weight; P = M Q, orthogonalise P, Q = M^T P, send (P, Q), M ~ P Q^T. A tensor that factoring
// would not shrink 2x (a bias, a thin matrix) goes raw. Q is warm-started from the previous call
// per tensor, so each instance must encode one stream of same-shaped inputs (one per tensor, or
// one per model with blocks). Use it with error feedback. Layout: docs/wire-format.md §powersgd.v2.
//
// The distributed form averages P across workers before orthogonalising and Q after; the helpers
// below expose those steps for the aggregator.
#ifndef TERN_KERNELS_CPU_POWERSGD_H_
#define TERN_KERNELS_CPU_POWERSGD_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: rank in [1, 256], default 4.
absl::StatusOr<std::unique_ptr<Codec>> NewPowerSgdCodec(SpecParams& params);

namespace powersgd {
// p[rows x r] = m[rows x cols] * q[cols x r], all row-major.
void MatMul(absl::Span<const float> m, absl::Span<const float> q, size_t rows, size_t cols,
            size_t r, absl::Span<float> p);
// q[cols x r] = m^T * p.
void MatMulT(absl::Span<const float> m, absl::Span<const float> p, size_t rows, size_t cols,
             size_t r, absl::Span<float> q);
// Orthonormalises the r columns of p[rows x r] in place (modified Gram-Schmidt, in double).
void Orthogonalize(absl::Span<float> p, size_t rows, size_t r);
}  // namespace powersgd

}  // namespace tern

#endif  // TERN_KERNELS_CPU_POWERSGD_H_
