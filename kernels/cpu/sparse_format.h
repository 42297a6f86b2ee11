// The (index, value) layout shared by topk.v1, dgc.v1 and threshold.v1 (kernels/format/sparse.h),
// and their common base:
//   u32 k | k x u32 index, strictly ascending, each < numel | k x f32 value
// Internal to kernels/.
#ifndef TERN_KERNELS_CPU_SPARSE_FORMAT_H_
#define TERN_KERNELS_CPU_SPARSE_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/codec.h"

namespace tern::internal {

// Writes the ascending indices `idx` and `values` (x at them, same order) into out->payload
// (header fields untouched).
void WriteSparsePayloadValues(absl::Span<const uint32_t> idx, absl::Span<const float> values,
                              EncodedTensor* out);
// Validates a sparse payload completely, then writes or accumulates it into `out`.
absl::Status DecodeSparsePayload(absl::string_view codec, const EncodedView& in, float weight,
                                 bool accumulate, absl::Span<float> out);

// Validates a sparse payload and returns its indices (used by the DGC memory to mask what it sent).
// What DecodeSparsePayload would refuse, without writing.
absl::Status ValidateSparsePayload(absl::string_view codec, const EncodedView& in);
// The decoded tensor's L2 norm (from the values), with ValidateSparsePayload's verdict.
absl::StatusOr<double> SparsePayloadNorm(absl::string_view codec, const EncodedView& in);
absl::Status ReadSparseIndices(absl::string_view codec, const EncodedView& in,
                               std::vector<uint32_t>* indices);

// Base of the codecs that send (index, value) pairs in this layout; a subclass only chooses the
// indices. Same thread-safety as Codec: Encode reuses an index scratch buffer.
class SparseCodec : public Codec {
 public:
  std::string Spec() const final { return spec_; }
  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) final;

 protected:
  // `spec` and `params` are the canonical spec and parameters (kernels/format/sparse.h), e.g.
  // "topk:ratio=0.01" and "ratio=0.01".
  SparseCodec(std::string spec, std::string params)
      : spec_(std::move(spec)), params_(std::move(params)) {}
  // Replaces *indices with the ascending indices to send and *values with x at them.
  // REQUIRES: x.size() < 2^32.
  virtual void Select(absl::Span<const float> x, ThreadPool* pool, std::vector<uint32_t>* indices,
                      std::vector<float>* values) = 0;
  // The payload of the chosen `indices` and `values` of an input of `numel` elements.
  void Write(uint64_t numel, absl::Span<const uint32_t> indices, absl::Span<const float> values,
             EncodedTensor* out) const;
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool*) const final {
    return DecodeSparsePayload(Name(), in, weight, accumulate, out);
  }
  absl::Status ValidateImpl(const EncodedView& in) const final {
    return ValidateSparsePayload(Name(), in);
  }
  absl::StatusOr<double> NormImpl(const EncodedView& in) const final {
    return SparsePayloadNorm(Name(), in);
  }

 private:
  const std::string spec_;
  const std::string params_;
  std::vector<uint32_t> indices_;
  std::vector<float> values_;
};

}  // namespace tern::internal

#endif  // TERN_KERNELS_CPU_SPARSE_FORMAT_H_
