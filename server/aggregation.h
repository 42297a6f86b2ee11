// Aggregation rules of the aggregator (ALGORITHMS.md §4): weighted FedAvg, coordinate-wise
// median, trimmed mean, Krum / Multi-Krum, majority-vote signSGD, each with optional norm
// clipping, in a registry keyed by spec ("fedavg", "median", "trimmed-mean:trim=0.1", "krum:f=1",
// "multi-krum:f=1,m=3", "majority-vote", any of them with ",clip=C").
// A round's updates are gathered by RoundAccumulator (server/accumulator.h), which streams
// plain FedAvg into a running sum and keeps the updates for the others.
//
// Thread-safety: rules are immutable after construction and safe to share.
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

// Rules by spec: fedavg, median, trimmed-mean[:trim=T], krum[:f=F], multi-krum[:f=F,m=M],
// majority-vote (each coordinate ±1: the sign most updates have there), each with an optional
// clip=C.
using AggregationRuleRegistry = Registry<AggregationRule>;
std::unique_ptr<AggregationRuleRegistry> NewBuiltinAggregationRuleRegistry();

// Scales `v` down to L2 norm `max_norm` when it is longer; returns the factor applied.
double ClipToNorm(absl::Span<float> v, double max_norm);

}  // namespace tern

#endif  // TERN_SERVER_AGGREGATION_H_
