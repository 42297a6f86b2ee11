// A Prometheus /metrics endpoint for a daemon, served by prometheus-cpp (Debian's
// prometheus-cpp-dev, its civetweb exposer). The samples are read from the daemon's own counters
// at scrape time through one Collect function, so what Prometheus stores is exactly what the
// daemon's Status / Stats RPC says, and the data path pays nothing for being watched.
//
// Thread-safety: MetricSet is not thread-safe (one per scrape). MetricsEndpoint is thread-safe;
// its Collect function runs on the exposer's threads, so it must be safe to call from any thread
// for as long as the endpoint lives.
#ifndef TERN_CORE_OPS_METRICS_H_
#define TERN_CORE_OPS_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "prometheus/metric_family.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace tern {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Observations sorted into fixed buckets, kept by the daemon (under its own lock) and copied
// into a scrape by MetricSet::Histogram.
struct HistogramCounts {
  explicit HistogramCounts(std::vector<double> upper_bounds)
      : bounds(std::move(upper_bounds)), counts(bounds.size(), 0) {}
  void Observe(double v);

  std::vector<double> bounds;    // ascending; +Inf is implied
  std::vector<uint64_t> counts;  // per bucket, not cumulative
  double sum = 0;
  uint64_t count = 0;
};

// The samples of one scrape, grouped into families by name (a family's help and type are those
// of its first sample). Counter names end in "_total", as Prometheus expects.
class MetricSet {
 public:
  // Labels every sample added from now on carries (first, unless the sample has its own value for
  // the name): a daemon's run, so that every series of one run can be selected together.
  void LabelEvery(MetricLabels labels) { common_ = std::move(labels); }
  void Counter(const std::string& name, const std::string& help, double value,
               const MetricLabels& labels = {});
  // One counter sample per reason, labelled reason="...", beside `labels`.
  void CountersByReason(const std::string& name, const std::string& help,
                        const std::map<std::string, uint64_t>& counts,
                        const MetricLabels& labels = {});
  void Gauge(const std::string& name, const std::string& help, double value,
             const MetricLabels& labels = {});
  void Histogram(const std::string& name, const std::string& help, const HistogramCounts& h,
                 const MetricLabels& labels = {});
  std::vector<prometheus::MetricFamily> Take() { return std::move(families_); }

 private:
  prometheus::ClientMetric& Add(const std::string& name, const std::string& help,
                                prometheus::MetricType type, const MetricLabels& labels);

  std::vector<prometheus::MetricFamily> families_;
  absl::flat_hash_map<std::string, size_t> index_;
  MetricLabels common_;
};

class MetricsEndpoint {
 public:
  using CollectFn = std::function<void(MetricSet&)>;

  // Serves GET /metrics on `listen` ("HOST:PORT", port 0 picks one). Every scrape also carries
  // tern_build_info and process_start_time_seconds. An address that cannot be bound is an
  // error, not a crash.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& listen,
                                                                CollectFn collect);
  // Stops serving: no Collect runs after this returns.
  ~MetricsEndpoint();

  int port() const { return port_; }

 private:
  class Collector;
  MetricsEndpoint() = default;

  std::shared_ptr<Collector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace tern

#endif  // TERN_CORE_OPS_METRICS_H_
