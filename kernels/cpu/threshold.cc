#include "kernels/cpu/threshold.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/cpu/sparse_format.h"
#include "kernels/select.h"

namespace tern {
namespace {

class ThresholdCodec final : public Codec {
 public:
  explicit ThresholdCodec(float tau) : tau_(tau), params_(absl::StrCat("tau=", tau)) {}
  absl::string_view Name() const override { return "threshold.v1"; }
  std::string Spec() const override { return absl::StrCat("threshold:", params_); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    SelectAtLeast(x, MagnitudeKey(tau_), &indices_, options.pool);
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
  const float tau_;
  const std::string params_;
  std::vector<uint32_t> indices_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewThresholdCodec(CodecParams& params) {
  TERN_ASSIGN_OR_RETURN(double tau, params.Double("tau", 1e-3, 0.0, 3.4e38));
  return std::make_unique<ThresholdCodec>(static_cast<float>(tau));
}

}  // namespace tern
