#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/algorithms/algorithms.h"
#include "worker/algorithms/base.h"

namespace tern {
namespace {

// SwarmSGD: H local SGD steps, then x <- (x + Q(x_j)) / 2 with one random neighbour j, without
// global rounds (the engine runs the pairwise exchanges). Combine mixes whatever it is handed,
// so the engine can also apply an average a neighbour started.
class Swarm final : public AlgorithmBase {
 public:
  using AlgorithmBase::AlgorithmBase;
  std::string Name() const override { return "swarm"; }
  std::vector<std::string> MessageParts() const override { return {"x"}; }
  bool Asynchronous() const override { return true; }
  bool Communicates(int64_t step) const override {
    return (step + 1) % std::max(1, options_.local_steps) == 0;
  }
  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr,
                                        int64_t step) override {
    for (size_t i = 0; i < x_.size(); ++i) x_[i] -= lr * g[i];
    return Publish(step);
  }
  absl::StatusOr<GossipMessage> Publish(int64_t step) override {
    GossipMessage msg;
    TERN_RETURN_IF_ERROR(AddPart(&msg, "x", x_, nullptr, step));
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_ASSIGN_OR_RETURN(x_, Mix(row, received, "x", x_));
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Algorithm> NewSwarm(const AlgorithmOptions& options, const CodecRegistry* codecs) {
  return std::make_unique<Swarm>(options, codecs);
}

}  // namespace tern
