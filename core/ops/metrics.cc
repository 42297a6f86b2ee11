#include "core/ops/metrics.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace tern {

namespace {

// When this process started, for process_start_time_seconds (read once, at the first endpoint).
double ProcessStartSeconds() {
  static const double start = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  return start;
}

}  // namespace

prometheus::ClientMetric& MetricSet::Add(const std::string& name, const std::string& help,
                                         prometheus::MetricType type, const MetricLabels& labels) {
  auto [it, added] = index_.try_emplace(name, families_.size());
  if (added) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = type;
    families_.push_back(std::move(f));
  }
  prometheus::MetricFamily& family = families_[it->second];
  prometheus::ClientMetric& m = family.metric.emplace_back();
  for (const auto& [k, v] : common_) {
    const bool own =
        std::any_of(labels.begin(), labels.end(), [&k = k](const auto& l) { return l.first == k; });
    if (!own) m.label.push_back({k, v});
  }
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  return m;
}

void MetricSet::Counter(const std::string& name, const std::string& help, double value,
                        const MetricLabels& labels) {
  Add(name, help, prometheus::MetricType::Counter, labels).counter.value = value;
}

void MetricSet::CountersByReason(const std::string& name, const std::string& help,
                                 const std::map<std::string, uint64_t>& counts,
                                 const MetricLabels& labels) {
  for (const auto& [reason, n] : counts) {
    MetricLabels l = labels;
    l.emplace_back("reason", reason);
    Counter(name, help, static_cast<double>(n), l);
  }
}

void MetricSet::Gauge(const std::string& name, const std::string& help, double value,
                      const MetricLabels& labels) {
  Add(name, help, prometheus::MetricType::Gauge, labels).gauge.value = value;
}

void HistogramCounts::Observe(double v) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (v <= bounds[i]) {
      ++counts[i];
      break;
    }
  }
  sum += v;
  ++count;
}

void MetricSet::Histogram(const std::string& name, const std::string& help,
                          const HistogramCounts& h, const MetricLabels& labels) {
  prometheus::ClientMetric& m = Add(name, help, prometheus::MetricType::Histogram, labels);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    m.histogram.bucket.push_back({cumulative, h.bounds[i]});
  }
  m.histogram.bucket.push_back({h.count, std::numeric_limits<double>::infinity()});
  m.histogram.sample_count = h.count;
  m.histogram.sample_sum = h.sum;
}

// What the exposer calls on each scrape: the daemon's counters plus the process's own.
class MetricsEndpoint::Collector final : public prometheus::Collectable {
 public:
  explicit Collector(CollectFn collect) : collect_(std::move(collect)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    MetricSet set;
    set.Gauge("tern_build_info", "The tern build serving these metrics (always 1).", 1,
              {{"version", TERN_VERSION}, {"wire_format", "tern.v1"}});
    set.Gauge("process_start_time_seconds", "Start time of the process since the Unix epoch.",
              ProcessStartSeconds());
    // On a thread of our own: civetweb runs this on its worker threads, whose stacks are 100 KB
    // (Debian's build, fixed at compile time), and a daemon's collect function under ASan came
    // within a few frames of that (a server's scrape overflowed it in session 20's CI run). A
    // scrape every few seconds affords a thread.
    std::thread collector([this, &set] { collect_(set); });
    collector.join();
    return set.Take();
  }

 private:
  const CollectFn collect_;
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& listen,
                                                                        CollectFn collect) {
  ProcessStartSeconds();
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  e->collector_ = std::make_shared<Collector>(std::move(collect));
  // prometheus-cpp reports a failed bind by throwing; it stops here, at startup.
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& ex) {
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint: cannot listen on ", listen, ": ", ex.what()));
  }
  e->exposer_->RegisterCollectable(e->collector_);
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics endpoint: no port bound for ", listen));
  }
  e->port_ = ports[0];
  return e;
}

MetricsEndpoint::~MetricsEndpoint() { exposer_.reset(); }

}  // namespace tern
