// dct.v1 — Dynamic Communication Thresholding's data-parallel sparsifier (Renggli et al.): every
// element with |x| at or above a threshold, where the threshold is the k-th largest magnitude
// (k = ceil(ratio · d), as topk) found by an exact top-k only every `every` encodes and reused in
// between, so most encodes are one filtering pass instead of a selection. Same layout as topk.v1;
// meant for error feedback, which sends later what a stale threshold leaves out. A threshold
// estimated at 0 (fewer than k non-zeros) is raised to the least positive magnitude, so zeros
// never go. A tensor of another size is estimated afresh.
//
// Encoder state (SaveEncoderState): the threshold, the encodes left before the next estimate and
// the size it was estimated for:
//   u8 version = 1 | u32 magnitude key (|x|'s bits) | u32 encodes left | u64 numel
#ifndef TERN_KERNELS_CPU_DCT_H_
#define TERN_KERNELS_CPU_DCT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: ratio in (0, 1], default 0.01; every in [1, 2^20], default 10 (1: top-k each time).
absl::StatusOr<std::unique_ptr<Codec>> NewDctCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_DCT_H_
