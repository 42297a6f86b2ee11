#include "kernels/dgc_memory.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/cpu/dgc.h"
#include "kernels/cpu/sparse_format.h"
#include "kernels/cpu/topk.h"

namespace tern {

absl::StatusOr<std::unique_ptr<DgcMemory>> DgcMemory::Create(const DgcOptions& options) {
  if (!(options.ratio > 0 && options.ratio <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("dgc: ratio ", options.ratio, " not in (0, 1]"));
  }
  if (!(options.momentum >= 0 && options.momentum < 1)) {
    return absl::InvalidArgumentError("dgc: momentum must be in [0, 1)");
  }
  if (options.clip_norm < 0 || options.num_workers < 1 || options.warmup_epochs < 0) {
    return absl::InvalidArgumentError("dgc: clip_norm, num_workers, warmup_epochs out of range");
  }
  return std::unique_ptr<DgcMemory>(new DgcMemory(options));
}

double DgcMemory::CurrentRatio() const {
  constexpr double kStart = 0.25;
  if (options_.warmup_epochs <= 0 || epoch_ >= options_.warmup_epochs || options_.ratio >= kStart) {
    return options_.ratio;
  }
  const double t = std::max(0.0, epoch_) / options_.warmup_epochs;
  return kStart * std::pow(options_.ratio / kStart, t);
}

absl::Status DgcMemory::Encode(absl::Span<const float> g, const EncodeOptions& options,
                               EncodedTensor* out) {
  if (u_.empty()) {
    u_.assign(g.size(), 0.0f);
    v_.assign(g.size(), 0.0f);
  } else if (u_.size() != g.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dgc memory holds ", u_.size(), " elements, got ", g.size()));
  }
  const double ratio = CurrentRatio();
  if (ratio != codec_ratio_) {
    // The ratio changes only during warm-up, a handful of times per epoch at most.
    auto parsed = SpecParams::ParseSpec(
        options_.exact_topk ? absl::StrCat("topk:ratio=", ratio)
                            : absl::StrCat("dgc:ratio=", ratio, ",sample=", options_.sample));
    TERN_RETURN_IF_ERROR(parsed.status());
    TERN_ASSIGN_OR_RETURN(
        codec_, options_.exact_topk ? NewTopKCodec(parsed->second) : NewDgcCodec(parsed->second));
    codec_ratio_ = ratio;
  }
  float scale = 1.0f;
  if (options_.clip_norm > 0) {
    const double limit = options_.clip_norm / std::sqrt(double(options_.num_workers));
    const double norm = std::sqrt(internal::SumSquares(g));
    if (norm > limit) scale = static_cast<float>(limit / norm);
  }
  const float m = static_cast<float>(options_.momentum);
  for (size_t i = 0; i < g.size(); ++i) {
    u_[i] = m * u_[i] + scale * g[i];
    v_[i] += u_[i];
  }
  TERN_RETURN_IF_ERROR(codec_->Encode(v_, options, out));
  TERN_RETURN_IF_ERROR(internal::ReadSparseIndices(codec_->Name(), EncodedView::Of(*out), &sent_));
  for (uint32_t i : sent_) {  // factor masking
    u_[i] = 0.0f;
    v_[i] = 0.0f;
  }
  return absl::OkStatus();
}

}  // namespace tern
