// The (index, value) wire format of topk.v1, threshold.v1, dgc.v1 and dct.v1
// (docs/wire-format.md §topk.v1), shared by the CPU codecs (kernels/cpu/sparse_format.h,
// topk.cc, threshold.cc, dgc.cc, dct.cc) and the GPU codecs (kernels/cuda/sparse.cu):
//   u32 k | k x u32 index, strictly ascending, each < numel | k x f32 value; no scales.
// Also each codec's parameters and canonical spec, and k for a ratio.
#ifndef TERN_KERNELS_FORMAT_SPARSE_H_
#define TERN_KERNELS_FORMAT_SPARSE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern::format {

inline constexpr char kTopKName[] = "topk.v1";
inline constexpr char kThresholdName[] = "threshold.v1";
inline constexpr char kDgcName[] = "dgc.v1";
inline constexpr char kDctName[] = "dct.v1";

// Elements a ratio keeps of d: ceil(ratio * d) in [1, d] (0 for d = 0).
size_t SparseK(double ratio, size_t d);

struct TopKParams {
  double ratio = 0.01;
  std::string Canonical() const;
  std::string Spec() const;
};
absl::StatusOr<TopKParams> ParseTopKParams(SpecParams& p);

struct ThresholdParams {
  float tau = 1e-3f;
  std::string Canonical() const;
  std::string Spec() const;
};
absl::StatusOr<ThresholdParams> ParseThresholdParams(SpecParams& p);

struct DgcParams {
  double ratio = 0.001;
  double sample = 0.01;
  std::string Canonical() const;
  std::string Spec() const;
};
absl::StatusOr<DgcParams> ParseDgcParams(SpecParams& p);

// Dynamic Communication Thresholding: the k-th magnitude (k = SparseK(ratio, d)) re-estimated
// every `every` encodes and used as a threshold in between.
struct DctParams {
  double ratio = 0.01;
  uint32_t every = 10;  // in [1, 2^20]
  std::string Canonical() const;
  std::string Spec() const;
};
absl::StatusOr<DctParams> ParseDctParams(SpecParams& p);

struct SparseHeader {
  uint32_t k = 0;
  const uint8_t* indices = nullptr;  // k x u32, not yet checked (range, order)
  const uint8_t* values = nullptr;   // k x f32
};
// Scales, k and sizes; the decoder checks the indices (CPU in one pass, GPU on the device).
absl::StatusOr<SparseHeader> ReadSparseHeader(absl::string_view codec, const EncodedView& in);

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_SPARSE_H_
