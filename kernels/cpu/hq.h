// hq.v1 — hierarchical quantization of a federated update (the "deep hierarchical quantization
// compression" paper among the federated works tern follows): the k = ceil(ratio · d) largest
// magnitudes (every element at ratio 1), split into tiers by magnitude, each tier quantized on
// its own grid with its own bit width, stochastically rounded (unbiased within the selection).
//
// The tier rule: the selected magnitudes are cut at their quantiles into tiers each twice the
// count of the one above (tier 0, the largest magnitudes, 1/(2^L − 1) of them; with 4 tiers 1, 2,
// 4 and 8 fifteenths); tier j's grid runs from the least to the largest magnitude in it, with
// 2^(bits_j − 1) levels. The selected values of an update are heavy-tailed: the few largest span
// most of the range and get the most bits, the many small ones sit in narrow bands where a few
// bits keep the error small. Layout in kernels/format/hq.h; the reasoning and what was measured
// in docs/codecs.md.
#ifndef TERN_KERNELS_CPU_HQ_H_
#define TERN_KERNELS_CPU_HQ_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: ratio in (0, 1], default 0.1; bits "6-4-3-2" (1 to 8 tiers, each 2 to 16 bits,
// largest magnitudes first).
absl::StatusOr<std::unique_ptr<Codec>> NewHqCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_HQ_H_
