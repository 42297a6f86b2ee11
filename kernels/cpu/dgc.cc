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

class DgcCodec final : public internal::SparseCodec {
 public:
  DgcCodec(double ratio, double sample)
      : SparseCodec("dgc", absl::StrCat("ratio=", ratio, ",sample=", sample)),
        ratio_(ratio),
        sample_(sample) {}
  absl::string_view Name() const override { return "dgc.v1"; }

 protected:
  void Select(absl::Span<const float> x, ThreadPool* pool, std::vector<uint32_t>* indices,
              std::vector<float>* values) override {
    SelectDgc(x, SparseK(ratio_, x.size()), sample_, indices, pool, values);
  }

 private:
  const double ratio_;
  const double sample_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewDgcCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(double ratio, params.Double("ratio", 0.001, 1e-9, 1.0));
  TERN_ASSIGN_OR_RETURN(double sample, params.Double("sample", 0.01, 1e-6, 1.0));
  return std::make_unique<DgcCodec>(ratio, sample);
}

}  // namespace tern
