#include "kernels/cpu/topk.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/cpu/sparse_format.h"
#include "kernels/format/sparse.h"
#include "kernels/select.h"

namespace tern {
namespace {

class TopKCodec final : public internal::SparseCodec {
 public:
  explicit TopKCodec(const format::TopKParams& p)
      : SparseCodec(p.Spec(), p.Canonical()), ratio_(p.ratio) {}
  absl::string_view Name() const override { return format::kTopKName; }
  size_t TopK(uint64_t n) const override { return format::SparseK(ratio_, n); }
  absl::Status EncodeSelection(const TopKSelection& selection, const EncodeOptions&,
                               EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(CheckSelection(*this, selection));
    Write(selection.numel, selection.indices, selection.values, out);
    return absl::OkStatus();
  }

 protected:
  void Select(absl::Span<const float> x, ThreadPool* pool, std::vector<uint32_t>* indices,
              std::vector<float>* values) override {
    SelectTopK(x, TopK(x.size()), indices, pool, values);
  }

 private:
  const double ratio_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewTopKCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::TopKParams p, format::ParseTopKParams(params));
  return std::make_unique<TopKCodec>(p);
}

}  // namespace tern
