#include "kernels/cpu/dgc.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/cpu/sparse_format.h"
#include "kernels/format/sparse.h"
#include "kernels/select.h"

namespace tern {
namespace {

class DgcCodec final : public internal::SparseCodec {
 public:
  explicit DgcCodec(const format::DgcParams& p)
      : SparseCodec(p.Spec(), p.Canonical()), ratio_(p.ratio), sample_(p.sample) {}
  absl::string_view Name() const override { return format::kDgcName; }

 protected:
  void Select(absl::Span<const float> x, ThreadPool* pool, std::vector<uint32_t>* indices,
              std::vector<float>* values) override {
    SelectDgc(x, format::SparseK(ratio_, x.size()), sample_, indices, pool, values);
  }

 private:
  const double ratio_;
  const double sample_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewDgcCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::DgcParams p, format::ParseDgcParams(params));
  return std::make_unique<DgcCodec>(p);
}

}  // namespace tern
