// What the aggregator and the scheduler show Prometheus (docs/deploy.md lists the metrics).
//
// Thread-safety: the Collect functions may run on any thread (they read the state machines'
// counters under their locks).
#ifndef TERN_SERVER_METRICS_H_
#define TERN_SERVER_METRICS_H_

#include "absl/time/time.h"
#include "core/ops/metrics.h"
#include "server/aggregator.h"
#include "server/membership.h"

namespace tern {

// `round_seconds`: the lengths of the rounds closed so far (from one close to the next).
void CollectAggregatorMetrics(const Aggregator& a, const HistogramCounts& round_seconds,
                              absl::Time now, MetricSet& m);
// `waiting`: the long polls (GetView, Barrier) waiting now.
void CollectSchedulerMetrics(const Membership& membership, int waiting, absl::Time now,
                             MetricSet& m);

}  // namespace tern

#endif  // TERN_SERVER_METRICS_H_
