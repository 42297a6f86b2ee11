// threshold.v1 — every element with |x| >= tau, as (index, value) pairs. Same layout as topk.v1.
#ifndef TERN_KERNELS_CPU_THRESHOLD_H_
#define TERN_KERNELS_CPU_THRESHOLD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: tau >= 0, default 0.001.
absl::StatusOr<std::unique_ptr<Codec>> NewThresholdCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_THRESHOLD_H_
