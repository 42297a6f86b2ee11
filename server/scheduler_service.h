// `tern scheduler`: the Membership state machine (server/membership.h) behind the
// tern.v1.Scheduler gRPC service: callback reactors (GetView and Barrier are long polls on a
// short alarm), health and reflection services, a ticker thread that declares silent members
// dead, and graceful shutdown.
//
// Thread-safety: Start/Shutdown from one thread; everything else is internally synchronised.
#ifndef TERN_SERVER_SCHEDULER_SERVICE_H_
#define TERN_SERVER_SCHEDULER_SERVICE_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/ops/metrics.h"
#include "core/rpc/security.h"
#include "grpcpp/grpcpp.h"
#include "server/membership.h"

namespace tern {

struct SchedulerServerOptions {
  std::string listen = "127.0.0.1:0";
  SchedulerOptions scheduler;
  absl::Duration tick = absl::Milliseconds(20);  // failure detection granularity
  // Long polls (GetView, Barrier) waiting at once, in all and per worker id; beyond either a
  // call is refused with RESOURCE_EXHAUSTED (each waiting call holds an alarm and a reply).
  int max_waiting_calls = 1024;
  int max_waiting_per_worker = 4;
  // "HOST:PORT" of a Prometheus /metrics endpoint (server/metrics.h); "" = none.
  std::string metrics_listen;
  // TLS for the gRPC port (core/rpc/security.h); with a CA, workers must present certificates
  // it signed.
  TlsFiles tls;
};

class SchedulerServer {
 public:
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(SchedulerServerOptions options,
                                                                const TopologyRegistry& topologies);
  ~SchedulerServer();

  int port() const { return port_; }
  // The /metrics endpoint's port, or 0 without one.
  int metrics_port() const { return metrics_ == nullptr ? 0 : metrics_->port(); }
  Membership& membership() { return *membership_; }
  // When the ticker last ran: a daemon whose ticker stopped is not alive (systemd's watchdog).
  absl::Time last_tick() const { return absl::FromUnixNanos(last_tick_ns_.load()); }
  void Shutdown(absl::Duration grace);

 private:
  class Service;
  SchedulerServer(SchedulerServerOptions options, std::unique_ptr<Membership> membership);
  void TickerThread();
  // Calls refused for their credentials (by reason) or for acting in another's name.
  void CollectCallerMetrics(MetricSet& m) const;
  // Takes a waiting slot for `worker`, or says which limit is reached; Release gives it back.
  absl::Status Admit(uint32_t worker) ABSL_LOCKS_EXCLUDED(wait_mu_);
  void Release(uint32_t worker) ABSL_LOCKS_EXCLUDED(wait_mu_);

  const SchedulerServerOptions options_;
  const std::unique_ptr<Membership> membership_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<CallAuthenticator> authenticator_;  // null when calls are not authenticated
  std::atomic<uint64_t> permission_denied_{0};        // calls in another member's name
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread ticker_;
  absl::Mutex wait_mu_;
  int waiting_ ABSL_GUARDED_BY(wait_mu_) = 0;
  std::map<uint32_t, int> waiting_by_worker_ ABSL_GUARDED_BY(wait_mu_);
  std::atomic<int64_t> last_tick_ns_{0};
  std::unique_ptr<MetricsEndpoint> metrics_;  // stopped first: it reads the above
};

}  // namespace tern

#endif  // TERN_SERVER_SCHEDULER_SERVICE_H_
