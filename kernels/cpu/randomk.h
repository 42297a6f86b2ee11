// randomk.v1 — k = ceil(ratio * d) values at pseudo-random distinct positions. Only the values and
// a seed travel: the positions are a keyed Feistel permutation of [0, d) evaluated at 0..k-1, which
// sender and receiver compute identically (docs/wire-format.md §randomk.v1). With unbiased=1 the
// values are scaled by d/k so that E[decode] = x.
#ifndef TERN_KERNELS_CPU_RANDOMK_H_
#define TERN_KERNELS_CPU_RANDOMK_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// Parameters: ratio in (0, 1], default 0.01; unbiased=0|1, default 0.
absl::StatusOr<std::unique_ptr<Codec>> NewRandomKCodec(SpecParams& params);

// The j-th position (j < d) of the permutation of [0, d) keyed by `seed`. REQUIRES: 0 < d <= 2^32.
uint32_t RandomKPosition(uint64_t seed, uint64_t d, uint32_t j);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_RANDOMK_H_
