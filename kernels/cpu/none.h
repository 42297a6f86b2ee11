// none.v1 — exact float32, 4 bytes per element (the dense baseline).
// Layout: numel little-endian words, docs/wire-format.md §none.v1.
#ifndef TERN_KERNELS_CPU_NONE_H_
#define TERN_KERNELS_CPU_NONE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern {

// No parameters.
absl::StatusOr<std::unique_ptr<Codec>> NewNoneCodec(SpecParams& params);

}  // namespace tern

#endif  // TERN_KERNELS_CPU_NONE_H_
