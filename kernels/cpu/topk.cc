#include "kernels/cpu/topk.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/cpu/sparse_format.h"
#include "kernels/select.h"

namespace tern {
namespace {

class TopKCodec final : public Codec {
 public:
  explicit TopKCodec(double ratio) : ratio_(ratio), params_(absl::StrCat("ratio=", ratio)) {}
  absl::string_view Name() const override { return "topk.v1"; }
  std::string Spec() const override { return absl::StrCat("topk:", params_); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    SelectTopK(x, SparseK(ratio_, x.size()), &indices_, options.pool);
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.clear();
    internal::WriteSparsePayload(x, indices_, out);
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool*) const override {
    return internal::DecodeSparsePayload(Name(), in, weight, accumulate, out);
  }

 private:
  const double ratio_;
  const std::string params_;
  std::vector<uint32_t> indices_;  // scratch reused across Encode calls
};

}  // namespace

size_t SparseK(double ratio, size_t d) {
  if (d == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(d));
  return std::clamp<size_t>(static_cast<size_t>(k), 1, d);
}

absl::StatusOr<std::unique_ptr<Codec>> NewTopKCodec(CodecParams& params) {
  TERN_ASSIGN_OR_RETURN(double ratio, params.Double("ratio", 0.01, 1e-9, 1.0));
  if (ratio <= 0) return absl::InvalidArgumentError("topk: ratio must be > 0");
  return std::make_unique<TopKCodec>(ratio);
}

}  // namespace tern
