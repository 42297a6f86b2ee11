#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/algorithms/algorithms.h"
#include "worker/algorithms/base.h"

namespace tern {
namespace {

// Local SGD: H plain SGD steps, then one exact gossip average of the models.
class LocalSgd final : public AlgorithmBase {
 public:
  using AlgorithmBase::AlgorithmBase;
  std::string Name() const override { return "local-sgd"; }
  std::vector<std::string> MessageParts() const override { return {"x"}; }
  bool Communicates(int64_t step) const override { return (step + 1) % StepsPerRound() == 0; }
  int64_t StepsPerRound() const override { return std::max(1, options_.local_steps); }
  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr,
                                        int64_t step) override {
    for (size_t i = 0; i < x_.size(); ++i) x_[i] -= lr * g[i];
    GossipMessage msg;
    if (Communicates(step)) TERN_RETURN_IF_ERROR(AddPart(&msg, "x", x_));
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_ASSIGN_OR_RETURN(x_, Mix(row, received, "x", x_));
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Algorithm> NewLocalSgd(const AlgorithmOptions& options,
                                       const CodecRegistry* codecs) {
  return std::make_unique<LocalSgd>(options, codecs);
}

}  // namespace tern
