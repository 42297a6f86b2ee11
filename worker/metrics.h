// What a worker shows Prometheus: its RoundEngine's counters (docs/deploy.md lists them).
//
// Thread-safety: CollectWorkerMetrics may run on any thread (it reads the engine's counters
// under the engine's lock).
#ifndef TERN_WORKER_METRICS_H_
#define TERN_WORKER_METRICS_H_

#include "core/ops/metrics.h"
#include "core/rpc/auth.h"
#include "worker/engine.h"

namespace tern {

void CollectWorkerMetrics(const RoundEngine& engine, const EngineOptions& options, MetricSet& m);
// Calls refused for their credentials, by reason. A function of its own: the exposer's threads
// have small stacks, and a scrape's frames must not pile up (ASan's are large).
void CollectAuthMetrics(const CallAuthenticator& authenticator, const EngineOptions& options,
                        MetricSet& m);

}  // namespace tern

#endif  // TERN_WORKER_METRICS_H_
