#include "kernels/cpu/dgc.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/cpu/sparse_format.h"
#include "kernels/cpu/topk.h"
#include "kernels/select.h"

namespace tern {
namespace {

class DgcCodec final : public Codec {
 public:
  DgcCodec(double ratio, double sample)
      : ratio_(ratio), sample_(sample), params_(absl::StrCat("ratio=", ratio, ",sample=", sample)) {}
  absl::string_view Name() const override { return "dgc.v1"; }
  std::string Spec() const override { return absl::StrCat("dgc:", params_); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    SelectDgc(x, SparseK(ratio_, x.size()), sample_, &indices_, options.pool);
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
  const double sample_;
  const std::string params_;
  std::vector<uint32_t> indices_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewDgcCodec(CodecParams& params) {
  TERN_ASSIGN_OR_RETURN(double ratio, params.Double("ratio", 0.001, 1e-9, 1.0));
  TERN_ASSIGN_OR_RETURN(double sample, params.Double("sample", 0.01, 1e-6, 1.0));
  return std::make_unique<DgcCodec>(ratio, sample);
}

}  // namespace tern
