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

class TopKCodec final : public internal::SparseCodec {
 public:
  explicit TopKCodec(double ratio)
      : SparseCodec("topk", absl::StrCat("ratio=", ratio)), ratio_(ratio) {}
  absl::string_view Name() const override { return "topk.v1"; }

 protected:
  void Select(absl::Span<const float> x, ThreadPool* pool, std::vector<uint32_t>* indices,
              std::vector<float>* values) override {
    SelectTopK(x, SparseK(ratio_, x.size()), indices, pool, values);
  }

 private:
  const double ratio_;
};

}  // namespace

size_t SparseK(double ratio, size_t d) {
  if (d == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(d));
  return std::clamp<size_t>(static_cast<size_t>(k), 1, d);
}

absl::StatusOr<std::unique_ptr<Codec>> NewTopKCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(double ratio, params.Double("ratio", 0.01, 1e-9, 1.0));
  if (ratio <= 0) return absl::InvalidArgumentError("topk: ratio must be > 0");
  return std::make_unique<TopKCodec>(ratio);
}

}  // namespace tern
