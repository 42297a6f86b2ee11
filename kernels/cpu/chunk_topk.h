// chunk-topk.v1 — SparseLoCo's compressor: in every chunk of `chunk` values the k largest |x|
// (ties to the lower index), each sent as a u16 position in its chunk and a `bits`-bit code: a
// sign and the index of one of 2^(bits−1) magnitude levels, the chunk's kept magnitudes split by
// rank into equal groups and each group sent as its mean (bits=1: one level, the mean |x| kept:
// STC per chunk). Biased: use error feedback (tern server --outer=sparseloco turns it on).
// Layout: docs/wire-format.md §chunk-topk.v1; the shared format in kernels/format/chunk_topk.h.
#ifndef TERN_KERNELS_CPU_CHUNK_TOPK_H_
#define TERN_KERNELS_CPU_CHUNK_TOPK_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: chunk in [1, 65536] (4096); k in [1, chunk] (64) or ratio (k = ceil(ratio ·
// chunk)); bits in [1, 8] (2).
absl::StatusOr<std::unique_ptr<Codec>> NewChunkTopKCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_CHUNK_TOPK_H_
