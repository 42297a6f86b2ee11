// dgc.v1 — Deep Gradient Compression's sparsifier: the threshold is estimated from a strided sample
// (~1 % of the tensor), refined as the DGC reference does (exact top-k of the selection when it
// exceeds 1.3k; threshold x0.8 when it is under 0.8k, at most 10 passes). Same layout as topk.v1.
// Momentum correction, factor masking, clipping and warm-up live in kernels/dgc_memory.h.
#ifndef TERN_KERNELS_CPU_DGC_H_
#define TERN_KERNELS_CPU_DGC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: ratio in (0, 1], default 0.001; sample in (0, 1], default 0.01.
absl::StatusOr<std::unique_ptr<Codec>> NewDgcCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_DGC_H_
