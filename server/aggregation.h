// Aggregation rules of the aggregator (ALGORITHMS.md §4): weighted FedAvg, coordinate-wise
// median, trimmed mean, Krum / Multi-Krum, each with optional norm clipping, in a registry
// keyed by spec ("fedavg", "median", "trimmed-mean:trim=0.1", "krum:f=1", "multi-krum:f=1,m=3",
// any of them with ",clip=C").
//
// FedAvg also has a streaming form (FedAvgAccumulator) that decodes each client's encoded update
// straight into the running sum, so the server never holds one decoded copy per client.
//
// Thread-safety: rules are immutable after construction and safe to share; a FedAvgAccumulator
// is thread-compatible (one per round, fed by the round's owner).
#ifndef TERN_SERVER_AGGREGATION_H_
#define TERN_SERVER_AGGREGATION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/registry.h"
#include "kernels/codec.h"
#include "kernels/registry.h"

namespace tern {

// One client's update for a round.
struct ClientUpdate {
  absl::Span<const float> values;
  double weight = 1.0;  // FedAvg: the client's sample count; robust rules ignore it
};

class AggregationRule {
 public:
  virtual ~AggregationRule() = default;
  // Canonical spec, e.g. "trimmed-mean:trim=0.1,clip=5".
  virtual std::string Spec() const = 0;
  // Writes the aggregate of `updates` (all the size of `out`) to `out`. InvalidArgument on no
  // updates, a size mismatch, a non-positive total weight or too few updates for the rule.
  virtual absl::Status Aggregate(const std::vector<ClientUpdate>& updates,
                                 absl::Span<float> out) const = 0;
};

// Rules by spec: fedavg, median, trimmed-mean[:trim=T], krum[:f=F], multi-krum[:f=F,m=M], each
// with an optional clip=C.
using AggregationRuleRegistry = Registry<AggregationRule>;
std::unique_ptr<AggregationRuleRegistry> NewBuiltinAggregationRuleRegistry();

// Scales `v` down to L2 norm `max_norm` when it is longer; returns the factor applied.
double ClipToNorm(absl::Span<float> v, double max_norm);

// Weighted FedAvg over encoded updates, accumulated as they arrive.
class FedAvgAccumulator {
 public:
  // `codecs` must outlive the accumulator. `clip` > 0 clips each decoded update's norm first
  // (which needs one decoded scratch vector, reused).
  FedAvgAccumulator(const CodecRegistry* codecs, size_t size, double clip = 0);
  // Adds one client's update with `weight` > 0. A malformed update is an error and changes
  // nothing.
  absl::Status Add(const EncodedView& update, double weight);
  size_t count() const { return count_; }
  // The weighted mean of what was added. FailedPrecondition when nothing was.
  absl::Status Finish(absl::Span<float> out) const;

 private:
  const CodecRegistry* codecs_;
  double clip_;
  std::vector<double> sum_;
  std::vector<float> scratch_;
  double total_weight_ = 0;
  size_t count_ = 0;
};

}  // namespace tern

#endif  // TERN_SERVER_AGGREGATION_H_
