// Conversions between a model's flat parameter or gradient vector and tern.v1.TensorBundle (one
// named tensor per layout entry), and the byte count every side reports for a bundle.
//
// Every function that reads a bundle treats it as untrusted and fails with InvalidArgument.
#ifndef TERN_CORE_MODEL_BUNDLE_H_
#define TERN_CORE_MODEL_BUNDLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/layout.h"
#include "kernels/registry.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// Layout entry `p` of `values` as `nt`: codec "none", shape set, fp32 bytes exactly.
absl::Status ExactTensor(const ParamTensor& p, absl::Span<const float> values, v1::NamedTensor* nt);

// `values` (the flat vector of `layout`) as one tensor per layout entry, codec "none", shapes set.
absl::StatusOr<v1::TensorBundle> FlatToBundle(const std::vector<ParamTensor>& layout,
                                              absl::Span<const float> values);

// `values` (the flat vector of `layout`) as one tensor per layout entry, each encoded by `codec`
// (seeded with options.seed + the tensor's index), shapes set. With `residual` (as long as
// `values`), error feedback: each tensor encodes values + residual, and the residual becomes
// what that encoding lost.
absl::StatusOr<v1::TensorBundle> EncodeFlatToBundle(const std::vector<ParamTensor>& layout,
                                                    absl::Span<const float> values, Codec& codec,
                                                    const EncodeOptions& options,
                                                    std::vector<float>* residual);

// One codec per tensor of a layout, made from one spec and kept from round to round: a codec
// with per-tensor state (PowerSGD's warm-started Q) then sees one tensor's stream, as it must.
//
// Thread-compatible.
class TensorCodecs {
 public:
  explicit TensorCodecs(const CodecRegistry* registry) : registry_(registry) {}
  // Codecs of `spec` for `tensors` tensors: the kept ones when neither changed, else new ones.
  absl::Status Use(const std::string& spec, size_t tensors);
  // Drops the codecs and their encoder state: the next Use makes new ones.
  void Clear() {
    spec_.clear();
    codecs_.clear();
  }
  size_t size() const { return codecs_.size(); }
  Codec& at(size_t i) { return *codecs_[i]; }

 private:
  const CodecRegistry* registry_;
  std::string spec_;
  std::vector<std::unique_ptr<Codec>> codecs_;
};

// As above, tensor i encoded by codecs.at(i) (codecs.size() == layout.size()), except that a
// tensor with exact[i] goes as ExactTensor of values + residual (its residual zeroed) and its
// codec never sees it (`exact` may be shorter than the layout: the rest are encoded).
absl::StatusOr<v1::TensorBundle> EncodeFlatToBundle(const std::vector<ParamTensor>& layout,
                                                    absl::Span<const float> values,
                                                    TensorCodecs& codecs,
                                                    const EncodeOptions& options,
                                                    std::vector<float>* residual,
                                                    const std::vector<bool>& exact = {});

// The bundle's encoded bytes as byte counters count them: payloads plus 4 bytes per scale (no
// names or framing).
uint64_t PayloadBytes(const v1::TensorBundle& bundle);

// Decodes `bundle` into `out` (the flat vector of `layout`): the tensors must be exactly the
// layout's, same names, order and element counts; any registered codec is accepted.
absl::Status BundleToFlat(const v1::TensorBundle& bundle, const std::vector<ParamTensor>& layout,
                          const CodecRegistry& codecs, absl::Span<float> out);

// The layout a registering trainer declares: names, shapes and offsets in bundle order.
absl::StatusOr<std::vector<ParamTensor>> LayoutFromBundle(const v1::TensorBundle& bundle,
                                                          uint64_t max_params);

// True when both layouts name the same tensors with the same shapes, in the same order.
bool SameLayout(const std::vector<ParamTensor>& a, const std::vector<ParamTensor>& b);

}  // namespace tern

#endif  // TERN_CORE_MODEL_BUNDLE_H_
