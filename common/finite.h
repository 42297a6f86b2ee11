// Whole-vector checks for Inf and NaN, vectorised: a daemon runs one over every gradient it takes.
#ifndef TERN_COMMON_FINITE_H_
#define TERN_COMMON_FINITE_H_

#include "absl/types/span.h"

namespace tern {

// True when no value of `x` is Inf or NaN. Reads all of `x` (no early exit, so it vectorises).
bool AllFinite(absl::Span<const float> x);

}  // namespace tern

#endif  // TERN_COMMON_FINITE_H_
