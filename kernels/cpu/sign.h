// sign.v1 — 1-bit sign compression: one sign bit per value and, per chunk of `chunk` values, the
// scale ||x_chunk||_1 / len, so x ~ scale * sign(x). Biased: pair it with error feedback
// (kernels/error_feedback.h) as EF-SignSGD does. Layout: docs/wire-format.md §sign.v1.
#ifndef TERN_KERNELS_CPU_SIGN_H_
#define TERN_KERNELS_CPU_SIGN_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: chunk in [8, 2^30] and a multiple of 8, default 1024.
absl::StatusOr<std::unique_ptr<Codec>> NewSignCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_SIGN_H_
