// Error feedback (memory) around any codec: keeps the residual e of what compression dropped and
// adds it back before the next encode.  p = g + e;  c = C(p);  send c;  e = p - D(c).
// Summed over steps, what was sent plus the final residual equals what was put in.
//
// Thread-safety: not thread-safe; one instance per tensor stream.
#ifndef TERN_KERNELS_ERROR_FEEDBACK_H_
#define TERN_KERNELS_ERROR_FEEDBACK_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/codec.h"

namespace tern {

// The one error-feedback step, over a residual the caller keeps (a slice of a model-sized
// buffer, or ErrorFeedback's own): residual += g; out = C(residual); residual -= D(out).
// REQUIRES: residual.size() == g.size().
absl::Status EncodeWithErrorFeedback(Codec& codec, absl::Span<const float> g,
                                     absl::Span<float> residual, const EncodeOptions& options,
                                     EncodedTensor* out);

class ErrorFeedback {
 public:
  explicit ErrorFeedback(std::unique_ptr<Codec> codec) : codec_(std::move(codec)) {}

  // Encodes g + residual into `out` and updates the residual. The first call fixes the tensor
  // size; a later call with another size is an InvalidArgument error.
  absl::Status Encode(absl::Span<const float> g, const EncodeOptions& options, EncodedTensor* out);

  absl::Span<const float> residual() const { return residual_; }
  void Reset() { residual_.clear(); }
  const Codec& codec() const { return *codec_; }

 private:
  std::unique_ptr<Codec> codec_;
  std::vector<float> residual_;
};

}  // namespace tern

#endif  // TERN_KERNELS_ERROR_FEEDBACK_H_
