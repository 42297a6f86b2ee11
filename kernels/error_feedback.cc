#include "kernels/error_feedback.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tern {

absl::Status EncodeWithErrorFeedback(Codec& codec, absl::Span<const float> g,
                                     absl::Span<float> residual, const EncodeOptions& options,
                                     EncodedTensor* out) {
  if (residual.size() != g.size()) {
    return absl::InvalidArgumentError(absl::StrCat("error feedback holds ", residual.size(),
                                                   " elements, got a tensor of ", g.size()));
  }
  // The residual buffer becomes p = g + e, is encoded, then loses what was sent: e = p - D(c).
  for (size_t i = 0; i < g.size(); ++i) residual[i] += g[i];
  TERN_RETURN_IF_ERROR(codec.Encode(residual, options, out));
  return codec.DecodeAccumulate(EncodedView::Of(*out), -1.0f, residual, options.pool);
}

absl::Status ErrorFeedback::Encode(absl::Span<const float> g, const EncodeOptions& options,
                                   EncodedTensor* out) {
  if (residual_.empty()) residual_.assign(g.size(), 0.0f);
  return EncodeWithErrorFeedback(*codec_, g, absl::MakeSpan(residual_), options, out);
}

}  // namespace tern
