// The (index, value) layout shared by topk.v1, dgc.v1 and threshold.v1:
//   u32 k | k x u32 index, strictly ascending, each < numel | k x f32 value
// Internal to kernels/.
#ifndef TERN_KERNELS_CPU_SPARSE_FORMAT_H_
#define TERN_KERNELS_CPU_SPARSE_FORMAT_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/codec.h"

namespace tern::internal {

// Writes x[idx[j]] for the ascending indices `idx` into out->payload (header fields untouched).
void WriteSparsePayload(absl::Span<const float> x, absl::Span<const uint32_t> idx,
                        EncodedTensor* out);

// Validates a sparse payload completely, then writes or accumulates it into `out`.
absl::Status DecodeSparsePayload(absl::string_view codec, const EncodedView& in, float weight,
                                 bool accumulate, absl::Span<float> out);

// Validates a sparse payload and returns its indices (used by the DGC memory to mask what it sent).
absl::Status ReadSparseIndices(absl::string_view codec, const EncodedView& in,
                               std::vector<uint32_t>* indices);

}  // namespace tern::internal

#endif  // TERN_KERNELS_CPU_SPARSE_FORMAT_H_
