#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/algorithms/algorithms.h"
#include "worker/algorithms/base.h"

namespace tern {
namespace {

// DecentLaM: mix = sum_j w_ij (x_j - lr g_j); m <- beta m + (x - mix) / lr; x <- x - lr m.
class DecentLam final : public AlgorithmBase {
 public:
  using AlgorithmBase::AlgorithmBase;
  std::string Name() const override { return "decentlam"; }
  double Momentum() const override { return options_.momentum; }
  std::vector<std::string> MessageParts() const override { return {"x"}; }
  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr, int64_t) override {
    lr_ = lr;
    half_.resize(x_.size());
    for (size_t i = 0; i < x_.size(); ++i) half_[i] = x_[i] - lr * g[i];
    GossipMessage msg;
    TERN_RETURN_IF_ERROR(AddPart(&msg, "x", half_));
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_RETURN_IF_ERROR(RequirePrepared(half_));
    TERN_ASSIGN_OR_RETURN(std::vector<float> mix, Mix(row, received, "x", half_));
    m_.resize(x_.size(), 0.0f);
    const float beta = static_cast<float>(options_.momentum);
    for (size_t i = 0; i < x_.size(); ++i) {
      m_[i] = beta * m_[i] + (x_[i] - mix[i]) / lr_;
      x_[i] -= lr_ * m_[i];
    }
    return absl::OkStatus();
  }

 private:
  float lr_ = 0;
  std::vector<float> half_;
};

}  // namespace

std::unique_ptr<Algorithm> NewDecentLam(const AlgorithmOptions& options,
                                        const CodecRegistry* codecs) {
  return std::make_unique<DecentLam>(options, codecs);
}

}  // namespace tern
