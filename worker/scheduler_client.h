// A worker's side of `tern scheduler`: registers (taking its id back after a restart),
// heartbeats on its own thread with the worker's progress, follows membership epochs, and
// answers which workers are members in a round (for MemberTopology) and barriers.
//
// Thread-safety: thread-safe. The heartbeat thread runs from Start() until Stop() or
// destruction; MembersFor may be called from any thread (the engine's).
#ifndef TERN_WORKER_SCHEDULER_CLIENT_H_
#define TERN_WORKER_SCHEDULER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tern/v1/scheduler.grpc.pb.h"

namespace tern {

struct SchedulerClientOptions {
  std::string run_id = "tern";
  std::string name;
  std::string address;     // where peers reach this worker
  int64_t worker_id = -1;  // -1: any
  absl::Duration call_timeout = absl::Seconds(5);
  // The worker's progress, sent with each heartbeat (the scheduler picks switch rounds from it).
  std::function<int64_t()> progress;
  // The static configuration's worker count: epochs before the membership first reached it
  // (workers still starting) are not applied. 0: apply every epoch.
  int expected_members = 0;
};

class SchedulerClient {
 public:
  // Registers (retrying while the scheduler is unreachable, up to `wait`) and starts
  // heartbeating.
  static absl::StatusOr<std::unique_ptr<SchedulerClient>> Start(
      std::shared_ptr<grpc::Channel> channel, SchedulerClientOptions options,
      absl::Duration wait = absl::Seconds(30));
  ~SchedulerClient();

  uint32_t id() const;
  uint64_t epoch() const;
  // The members (sorted ids) in `round`: those of the newest epoch whose from_round <= round;
  // nullopt before any such epoch (every worker, as the static configuration says).
  std::optional<std::vector<int>> MembersFor(int64_t round) const;
  absl::StatusOr<v1::View> View(uint64_t round);
  // Waits at barrier `name` until every member arrived (or the timeout passes).
  absl::Status Barrier(const std::string& name, absl::Duration timeout);
  // Stops heartbeating; with `leave`, says so to the scheduler (an orderly exit).
  void Stop(bool leave);

 private:
  struct Epoch {
    uint64_t epoch;
    int64_t from_round;
    std::vector<int> members;
  };
  SchedulerClient(std::shared_ptr<grpc::Channel> channel, SchedulerClientOptions options);
  absl::Status Register();
  void HeartbeatLoop();
  // Fetches the view of a new epoch and records its members.
  void Follow(uint64_t epoch, int64_t from_round);
  void Deadline(grpc::ClientContext* ctx, absl::Duration extra = absl::ZeroDuration()) const;

  const SchedulerClientOptions options_;
  const std::unique_ptr<v1::Scheduler::Stub> stub_;
  absl::Duration interval_ = absl::Seconds(1);

  mutable absl::Mutex mu_;
  uint32_t id_ ABSL_GUARDED_BY(mu_) = 0;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool formed_ ABSL_GUARDED_BY(mu_) = false;  // the membership reached expected_members
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Epoch> epochs_ ABSL_GUARDED_BY(mu_);  // by epoch, the ones seen

  absl::Notification stop_;
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

}  // namespace tern

#endif  // TERN_WORKER_SCHEDULER_CLIENT_H_
