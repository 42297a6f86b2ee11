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
  int64_t worker_id = -1;  // -1: the lowest free id below ids_below
  uint32_t ids_below = 0;  // with worker_id -1: the run's size (0: the scheduler's limit)
  absl::Duration call_timeout = absl::Seconds(5);
  // The worker's progress, sent with each heartbeat (the scheduler picks switch rounds from it).
  std::function<int64_t()> progress;
  // The static configuration's worker count: epochs before the membership first reached it
  // (workers still starting) are not applied. 0: apply every epoch.
  int expected_members = 0;
  // An elastic run (`--min_workers`): it starts once this many members have addresses
  // (v1::RunStart); its first epoch applies from round 0, earlier ones never, and
  // expected_members is not used. 0: not elastic.
  uint32_t start_with = 0;
  // Called with the members of each new epoch (ids and the addresses they advertise), on the
  // heartbeat thread, outside any lock: a worker whose peers come from the scheduler follows a
  // peer that came back at another address.
  std::function<void(const std::vector<v1::Member>&)> on_members;
};

class SchedulerClient {
 public:
  // Registers (retrying while the scheduler is unreachable or, for an id it assigns, while
  // every id is taken: up to `wait`) and starts heartbeating.
  static absl::StatusOr<std::unique_ptr<SchedulerClient>> Start(
      std::shared_ptr<grpc::Channel> channel, SchedulerClientOptions options,
      absl::Duration wait = absl::Seconds(30));
  ~SchedulerClient();

  uint32_t id() const;
  // Registers again, with the same id, at `address` (known once the daemon listens): a new
  // epoch, through which the other members learn it.
  absl::Status Advertise(const std::string& address);
  // The rendezvous of a run whose peers come from the scheduler: waits until ids 0..workers-1
  // are all members with addresses (an elastic run: until it has started) and returns the
  // members' addresses by id ("" for an id that is not a member). Waits at least two heartbeat
  // intervals past this worker's (last) registration, so that every member has heard its
  // address before it sends or asks anything: a worker restarted at a new address is then
  // reached there. DeadlineExceeded after `wait`; Cancelled once `stopped` says so.
  absl::StatusOr<std::vector<std::string>> WaitForPeers(int workers, absl::Duration wait,
                                                        const std::function<bool()>& stopped);
  uint64_t epoch() const;
  // The members (sorted ids) in `round`: those of the newest epoch whose from_round <= round;
  // nullopt before any such epoch (every worker, as the static configuration says).
  std::optional<std::vector<int>> MembersFor(int64_t round) const;
  // An elastic run: the round from which this worker is a member at the address it registered
  // last (0 for one it started with; a later joiner's epoch's from_round), once the epochs
  // followed say so; nullopt until then.
  std::optional<int64_t> MemberFrom() const;
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
  // Records epoch `e` (past the last one recorded, and once the run is formed).
  void Record(Epoch e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records an elastic run's start: its members from round 0, and no epoch before it.
  void Started(const v1::RunStart& start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deadline(grpc::ClientContext* ctx, absl::Duration extra = absl::ZeroDuration()) const;

  const SchedulerClientOptions options_;
  const std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::atomic<int64_t> interval_ms_{1000};

  mutable absl::Mutex mu_;
  uint32_t id_ ABSL_GUARDED_BY(mu_) = 0;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  std::string address_ ABSL_GUARDED_BY(mu_);  // as advertised
  absl::Time registered_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t registered_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // the last registration's
  // The membership reached expected_members, or the elastic run started.
  bool formed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Epoch> epochs_ ABSL_GUARDED_BY(mu_);  // by epoch, the ones seen

  absl::Notification stop_;
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

}  // namespace tern

#endif  // TERN_WORKER_SCHEDULER_CLIENT_H_
