#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/algorithms/algorithms.h"
#include "worker/algorithms/base.h"

namespace tern {
namespace {

// Heavy-ball consensus: neighbours exchange x and m; m <- beta sum_j w_ij m_j + g;
// x <- sum_j w_ij x_j - lr m.
class HeavyBall final : public AlgorithmBase {
 public:
  using AlgorithmBase::AlgorithmBase;
  std::string Name() const override { return "heavy-ball"; }
  double Momentum() const override { return options_.momentum; }
  std::vector<std::string> MessageParts() const override { return {"x", "m"}; }
  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr, int64_t) override {
    lr_ = lr;
    g_.assign(g.begin(), g.end());
    m_.resize(x_.size(), 0.0f);
    GossipMessage msg;
    TERN_RETURN_IF_ERROR(AddPart(&msg, "x", x_));
    TERN_RETURN_IF_ERROR(AddPart(&msg, "m", m_));
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_RETURN_IF_ERROR(RequirePrepared(g_));
    TERN_ASSIGN_OR_RETURN(std::vector<float> mx, Mix(row, received, "x", x_));
    TERN_ASSIGN_OR_RETURN(std::vector<float> mm, Mix(row, received, "m", m_));
    const float beta = static_cast<float>(options_.momentum);
    for (size_t i = 0; i < x_.size(); ++i) {
      m_[i] = beta * mm[i] + g_[i];
      x_[i] = mx[i] - lr_ * m_[i];
    }
    return absl::OkStatus();
  }

 private:
  float lr_ = 0;
  std::vector<float> g_;
};

}  // namespace

std::unique_ptr<Algorithm> NewHeavyBall(const AlgorithmOptions& options,
                                        const CodecRegistry* codecs) {
  return std::make_unique<HeavyBall>(options, codecs);
}

}  // namespace tern
