// topk.v1 — exact top-k sparsification: the k = ceil(ratio * d) largest-|x| (index, value) pairs.
// Layout: kernels/cpu/sparse_format.h and docs/wire-format.md §topk.v1.
#ifndef TERN_KERNELS_CPU_TOPK_H_
#define TERN_KERNELS_CPU_TOPK_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: ratio in (0, 1], default 0.01.
absl::StatusOr<std::unique_ptr<Codec>> NewTopKCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_TOPK_H_
