// `tern server`: the Aggregator state machine (server/aggregator.h) behind the tern.v1.Aggregator
// gRPC service, with callback reactors, health and reflection services, a ticker thread that
// closes and opens rounds, and graceful shutdown.
//
// Thread-safety: Start/Shutdown from one thread; everything else is internally synchronised.
#ifndef TERN_SERVER_SERVICE_H_
#define TERN_SERVER_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/thread_pool.h"
#include "core/ops/metrics.h"
#include "core/rpc/security.h"
#include "core/rpc/stream_limits.h"
#include "grpcpp/grpcpp.h"
#include "kernels/registry.h"
#include "server/aggregator.h"
#include "server/fetch_waiters.h"

namespace tern {

struct ServerOptions {
  std::string listen = "127.0.0.1:0";
  AggregatorOptions aggregator;
  absl::Duration tick = absl::Milliseconds(20);
  uint64_t max_bundle_bytes = uint64_t{1} << 31;
  // Incoming InitModel / Push streams (Fetch long polls are not counted: every client keeps
  // one). Many clients may share one host (NAT, a client swarm), so per-host is as wide as the
  // total; max_buffered_bytes 0 = sized for the model (16 updates, at least 256 MiB).
  StreamLimitOptions limits{
      .max_streams = 4096, .max_streams_per_peer = 4096, .max_buffered_bytes = 0};
  // "HOST:PORT" of a Prometheus /metrics endpoint (server/metrics.h); "" = none.
  std::string metrics_listen;
  // TLS for the gRPC port (core/rpc/security.h); with a CA, clients must present certificates
  // it signed.
  TlsFiles tls;
};

class AggregatorServer {
 public:
  // `registries` must outlive the server (the aggregator decodes with its codecs).
  static absl::StatusOr<std::unique_ptr<AggregatorServer>> Start(
      ServerOptions options, const ServerRegistries* registries);
  ~AggregatorServer();

  int port() const { return port_; }
  // The /metrics endpoint's port, or 0 without one.
  int metrics_port() const { return metrics_ == nullptr ? 0 : metrics_->port(); }
  Aggregator& aggregator() { return *aggregator_; }
  // When the ticker last ran: a daemon whose ticker stopped is not alive (systemd's watchdog).
  absl::Time last_tick() const { return absl::FromUnixNanos(last_tick_ns_.load()); }
  // Blocks until the run is done (every round closed) or Shutdown is called.
  void WaitDone();
  // Stops taking calls, lets running ones finish for up to `grace`, stops the ticker.
  void Shutdown(absl::Duration grace);

 private:
  class Service;
  AggregatorServer(ServerOptions options, std::unique_ptr<Aggregator> aggregator);
  void TickerThread();
  // With an automatic budget: 16 updates' worth of bytes once the model's size is known.
  void SizeBudget();
  // Wakes the parked Fetch calls when the aggregator had an event since the last wake-up.
  void WakeFetches();
  // Whether the call's caller is `client` (Aggregator::CheckCaller), logged when not: nobody
  // fetches, pushes or leaves in another client's name.
  absl::Status Caller(const std::string& principal, uint32_t client);
  absl::Status Caller(const grpc::ServerContextBase& ctx, uint32_t client);
  // Calls refused for their credentials (by reason) or for acting in another's name.
  void CollectCallerMetrics(MetricSet& m) const;

  const ServerOptions options_;
  const std::unique_ptr<Aggregator> aggregator_;
  const std::unique_ptr<StreamLimits> limits_;  // outlives server_ and its reactors
  FetchWaiters fetch_waiters_;                  // likewise
  std::unique_ptr<ThreadPool> push_pool_;       // likewise; drained before it goes
  std::atomic<uint64_t> woken_events_{0};
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<CallAuthenticator> authenticator_;  // null when calls are not authenticated
  std::atomic<uint64_t> permission_denied_{0};        // calls in another client's name
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  absl::Notification done_;
  std::thread ticker_;
  std::atomic<int64_t> last_tick_ns_{0};
  absl::Mutex round_mu_;
  HistogramCounts round_seconds_ ABSL_GUARDED_BY(round_mu_){
      {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};
  std::unique_ptr<MetricsEndpoint> metrics_;  // stopped first: it reads the above
};

}  // namespace tern

#endif  // TERN_SERVER_SERVICE_H_
