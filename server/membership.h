// The scheduler's state machine (`tern scheduler`), independent of gRPC and of the clock:
// registration with ids, heartbeats and failure detection, membership epochs, named barriers,
// and each member's gossip neighbours for a round over the current members (so the graph is
// repaired when a worker dies: the topology is rebuilt over the survivors, ranked by id). An
// elastic run (registrations asking start_with) starts once that many members have addresses:
// those are its first epoch from round 0 (v1::RunStart), and later members join later epochs.
// server/scheduler_service.h puts it behind tern.v1.Scheduler.
//
// Thread-safety: thread-safe; every public method takes the internal mutex.
#ifndef TERN_SERVER_MEMBERSHIP_H_
#define TERN_SERVER_MEMBERSHIP_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/topology/topology.h"
#include "tern/v1/scheduler.pb.h"

namespace tern {

struct SchedulerOptions {
  std::string run_id = "tern";
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // A member silent this long is declared dead (a new epoch without it).
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  std::string topology = "ring";
  WeightRule weights = WeightRule::kAuto;
  int max_members = 4096;
  // A new epoch's members apply from the furthest member's round plus this many rounds, plus
  // the rounds the fastest member runs in two heartbeat intervals (the time for every member to
  // hear of the epoch), so nobody is already past the switch when it learns of it.
  int64_t switch_lag_rounds = 2;
  int keep_failures = 256;
  // Who may register (each a name or a prefix ending in '*'); empty: anyone authenticated. With
  // names, each caller's name binds it to the member id it ends in (worker-3: 3).
  std::vector<std::string> member_names;
};

class Membership {
 public:
  static absl::StatusOr<std::unique_ptr<Membership>> Create(SchedulerOptions options,
                                                            const TopologyRegistry& topologies);

  // `principal`: who the call was authenticated as (core/rpc/auth.h); a member id is bound to
  // it while it is a member, and taking it (request.worker_id) is refused to anyone else.
  absl::StatusOr<v1::MemberRegisterReply> Register(const v1::MemberRegisterRequest& request,
                                                   absl::Time now,
                                                   const std::string& principal = "");
  // OK unless member `id` registered as someone other than `principal` (PERMISSION_DENIED).
  absl::Status CheckCaller(uint32_t id, const std::string& principal) const;
  // NotFound when `id` is not a member (never was, left, or was declared dead).
  absl::StatusOr<v1::HeartbeatReply> Heartbeat(const v1::HeartbeatRequest& request, absl::Time now);
  absl::StatusOr<v1::View> GetView(uint32_t id, uint64_t round, absl::Time now) const;
  // Arrives at a barrier (generation 0) or checks on the generation arrived at.
  absl::StatusOr<v1::BarrierReply> Barrier(const v1::BarrierRequest& request);
  absl::StatusOr<v1::MemberLeaveReply> Leave(uint32_t id);
  v1::MembersReply Members(absl::Time now) const;
  uint64_t epoch() const;
  // The elastic run's start, once it has started.
  std::optional<v1::RunStart> start() const;
  // Members declared dead since the start (the Members() reply keeps the latest keep_failures).
  uint64_t failures_declared() const;
  // Declares members silent for longer than the timeout dead; returns them.
  std::vector<v1::Failure> Tick(absl::Time now);
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Worker {
    std::string name;
    std::string principal;  // who registered it ("" without credentials)
    std::string address;
    int64_t round = -1;
    absl::Time last_seen;
    double rounds_per_s = 0;  // smoothed over heartbeats
  };
  struct BarrierState {
    uint64_t generation = 1;
    std::set<uint32_t> arrived;
  };

  Membership(SchedulerOptions options, std::unique_ptr<Topology> topology);
  // A membership change: a new epoch, and barriers re-checked against the new members.
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases `b` when every member has arrived; returns whether it did.
  bool MaybeRelease(BarrierState& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Member ToMember(uint32_t id, const Worker& w, absl::Time now) const;
  // Starts an elastic run that has start_with_ members with addresses.
  void MaybeStart() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rounds between the furthest member and a new epoch's first round.
  int64_t SwitchLag() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SchedulerOptions options_;
  const std::unique_ptr<Topology> topology_;

  mutable absl::Mutex mu_;
  std::map<uint32_t, Worker> members_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t from_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mu_);
  uint32_t start_with_ ABSL_GUARDED_BY(mu_) = 0;  // the most asked for before the start
  std::optional<v1::RunStart> start_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::Failure> failures_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::EpochRecord> recent_ ABSL_GUARDED_BY(mu_);  // the last epochs, this one last
  uint64_t failures_declared_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tern

#endif  // TERN_SERVER_MEMBERSHIP_H_
