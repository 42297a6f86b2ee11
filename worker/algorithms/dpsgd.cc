#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/algorithms/algorithms.h"
#include "worker/algorithms/base.h"

namespace tern {
namespace {

// D-PSGD (adapt then combine) and DmSGD: send x - lr * d with d = g (beta = 0) or the momentum
// buffer m = beta m + g; x <- sum_j w_ij (x_j - lr d_j).
class Dpsgd final : public AlgorithmBase {
 public:
  Dpsgd(const AlgorithmOptions& o, const CodecRegistry* c, bool momentum)
      : AlgorithmBase(o, c), momentum_(momentum) {}
  std::string Name() const override { return momentum_ ? "dmsgd" : "dpsgd"; }
  double Momentum() const override { return momentum_ ? options_.momentum : 0; }
  std::vector<std::string> MessageParts() const override { return {"x"}; }
  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr,
                                        int64_t step) override {
    half_.resize(x_.size());
    if (momentum_) {
      m_.resize(x_.size(), 0.0f);
      const float beta = static_cast<float>(options_.momentum);
      for (size_t i = 0; i < x_.size(); ++i) {
        m_[i] = beta * m_[i] + g[i];
        half_[i] = x_[i] - lr * m_[i];
      }
    } else {
      for (size_t i = 0; i < x_.size(); ++i) half_[i] = x_[i] - lr * g[i];
    }
    GossipMessage msg;
    TERN_RETURN_IF_ERROR(AddPart(&msg, "x", half_));
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_RETURN_IF_ERROR(RequirePrepared(half_));
    TERN_ASSIGN_OR_RETURN(x_, Mix(row, received, "x", half_));
    return absl::OkStatus();
  }

 private:
  const bool momentum_;
  std::vector<float> half_;
};

}  // namespace

std::unique_ptr<Algorithm> NewDpsgd(const AlgorithmOptions& options, const CodecRegistry* codecs) {
  return std::make_unique<Dpsgd>(options, codecs, /*momentum=*/false);
}

std::unique_ptr<Algorithm> NewDmsgd(const AlgorithmOptions& options, const CodecRegistry* codecs) {
  return std::make_unique<Dpsgd>(options, codecs, /*momentum=*/true);
}

}  // namespace tern
