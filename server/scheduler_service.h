// `tern scheduler`: the Membership state machine (server/membership.h) behind the
// tern.v1.Scheduler gRPC service: callback reactors (GetView and Barrier are long polls on a
// short alarm), health and reflection services, a ticker thread that declares silent members
// dead, and graceful shutdown.
//
// Thread-safety: Start/Shutdown from one thread; everything else is internally synchronised.
#ifndef TERN_SERVER_SCHEDULER_SERVICE_H_
#define TERN_SERVER_SCHEDULER_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "server/membership.h"

namespace tern {

struct SchedulerServerOptions {
  std::string listen = "127.0.0.1:0";
  SchedulerOptions scheduler;
  absl::Duration tick = absl::Milliseconds(20);  // failure detection granularity
};

class SchedulerServer {
 public:
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(SchedulerServerOptions options,
                                                                const TopologyRegistry& topologies);
  ~SchedulerServer();

  int port() const { return port_; }
  Membership& membership() { return *membership_; }
  void Shutdown(absl::Duration grace);

 private:
  class Service;
  SchedulerServer(SchedulerServerOptions options, std::unique_ptr<Membership> membership);
  void TickerThread();

  const SchedulerServerOptions options_;
  const std::unique_ptr<Membership> membership_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread ticker_;
};

}  // namespace tern

#endif  // TERN_SERVER_SCHEDULER_SERVICE_H_
