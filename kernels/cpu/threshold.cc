#include "kernels/cpu/threshold.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/cpu/sparse_format.h"
#include "kernels/format/sparse.h"
#include "kernels/select.h"

namespace tern {
namespace {

class ThresholdCodec final : public internal::SparseCodec {
 public:
  explicit ThresholdCodec(const format::ThresholdParams& p)
      : SparseCodec(p.Spec(), p.Canonical()), tau_(p.tau) {}
  absl::string_view Name() const override { return format::kThresholdName; }

 protected:
  void Select(absl::Span<const float> x, ThreadPool* pool, std::vector<uint32_t>* indices,
              std::vector<float>* values) override {
    SelectAtLeast(x, MagnitudeKey(tau_), indices, pool, values);
  }

 private:
  const float tau_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewThresholdCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::ThresholdParams p, format::ParseThresholdParams(params));
  return std::make_unique<ThresholdCodec>(p);
}

}  // namespace tern
