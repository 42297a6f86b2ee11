#include "server/membership.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "core/rpc/auth.h"

namespace tern {

absl::StatusOr<std::unique_ptr<Membership>> Membership::Create(SchedulerOptions options,
                                                               const TopologyRegistry& topologies) {
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError(
        "need 0 < heartbeat interval < heartbeat timeout (a live worker must not look dead)");
  }
  if (options.switch_lag_rounds < 0) {
    return absl::InvalidArgumentError("switch lag must be >= 0 rounds");
  }
  if (options.max_members < 1) return absl::InvalidArgumentError("max members must be >= 1");
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Topology> topology, topologies.Create(options.topology));
  return std::unique_ptr<Membership>(new Membership(std::move(options), std::move(topology)));
}

Membership::Membership(SchedulerOptions options, std::unique_ptr<Topology> topology)
    : options_(std::move(options)), topology_(std::move(topology)) {}

void Membership::Changed() {
  ++epoch_;
  MaybeStart();
  int64_t furthest = -1;
  for (const auto& [id, w] : members_) furthest = std::max(furthest, w.round);
  from_round_ = std::max(from_round_, furthest + 1 + SwitchLag());
  v1::EpochRecord& r = recent_.emplace_back();
  r.set_epoch(epoch_);
  r.set_from_round(from_round_);
  for (const auto& [id, w] : members_) r.add_members(id);
  constexpr size_t kRecent = 17;  // this one and the 16 before
  while (recent_.size() > kRecent) recent_.pop_front();
  for (auto& [name, b] : barriers_) {
    for (auto it = b.arrived.begin(); it != b.arrived.end();) {
      it = members_.count(*it) ? std::next(it) : b.arrived.erase(it);
    }
    if (!b.arrived.empty()) MaybeRelease(b);
  }
}

void Membership::MaybeStart() {
  if (start_.has_value() || start_with_ == 0) return;
  std::vector<uint32_t> ids;
  for (const auto& [id, w] : members_) {
    if (!w.address.empty()) ids.push_back(id);
  }
  if (ids.size() < start_with_) return;
  // Members still without an address are not in it: nobody could reach them in round 0. They
  // join at their next registration's epoch, as a later member does.
  v1::RunStart& s = start_.emplace();
  s.set_epoch(epoch_);
  for (uint32_t id : ids) s.add_members(id);
}

std::optional<v1::RunStart> Membership::start() const {
  absl::MutexLock lock(&mu_);
  return start_;
}

int64_t Membership::SwitchLag() const {
  // A member reports its round once an interval and hears of an epoch at its next heartbeat:
  // two intervals of the fastest member's progress. Capped, as the rates are members' word.
  constexpr double kMaxRateLag = 4096;
  double fastest = 0;
  for (const auto& [id, w] : members_) fastest = std::max(fastest, w.rounds_per_s);
  const double lag = fastest * absl::ToDoubleSeconds(2 * options_.heartbeat_interval);
  return options_.switch_lag_rounds + static_cast<int64_t>(std::ceil(std::min(lag, kMaxRateLag)));
}

bool Membership::MaybeRelease(BarrierState& b) {
  for (const auto& [id, w] : members_) {
    if (!b.arrived.count(id)) return false;
  }
  ++b.generation;
  b.arrived.clear();
  return true;
}

absl::Status Membership::CheckCaller(uint32_t id, const std::string& principal) const {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(id);
  if (it == members_.end() || it->second.principal == principal) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("worker ", id, " registered as '",
                                                  it->second.principal, "'; this call comes from '",
                                                  principal, "'"));
}

absl::StatusOr<v1::MemberRegisterReply> Membership::Register(const v1::MemberRegisterRequest& req,
                                                             absl::Time now,
                                                             const std::string& principal) {
  absl::MutexLock lock(&mu_);
  if (req.run_id() != options_.run_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("this scheduler runs '", options_.run_id, "', not '", req.run_id(), "'"));
  }
  if (req.worker_id() < -1 || req.worker_id() >= options_.max_members) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker id ", req.worker_id(), " outside [0, ", options_.max_members, ")"));
  }
  uint32_t id = 0;
  if (!options_.member_names.empty()) {
    // The caller's name says which member it is.
    const std::optional<int> bound = WorkerIdOf(principal);
    if (!PrincipalAllowed(options_.member_names, principal) || !bound.has_value() ||
        *bound >= options_.max_members) {
      return absl::PermissionDeniedError(absl::StrCat(
          "'", principal, "' may not register in this run (--member_names=",
          absl::StrJoin(options_.member_names, ","), "; a name ends in its worker id)"));
    }
    if (req.worker_id() >= 0 && req.worker_id() != *bound) {
      return absl::PermissionDeniedError(absl::StrCat("'", principal, "' registered as worker ",
                                                      req.worker_id(),
                                                      "; its name makes it worker ", *bound));
    }
    id = static_cast<uint32_t>(*bound);
  } else if (req.worker_id() >= 0) {
    // A worker that restarted takes its id back (its old incarnation is replaced).
    id = static_cast<uint32_t>(req.worker_id());
  } else {
    const int below = req.ids_below() > 0
                          ? std::min(static_cast<int>(std::min<uint32_t>(req.ids_below(), 1 << 30)),
                                     options_.max_members)
                          : options_.max_members;
    while (members_.count(id)) ++id;
    if (static_cast<int>(id) >= below) {
      return absl::ResourceExhaustedError(
          absl::StrCat("every id below ", below,
                       " is a member: the run has its workers (a worker that "
                       "died frees its id once declared dead)"));
    }
  }
  if (!members_.count(id) && static_cast<int>(members_.size()) >= options_.max_members) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the run has its maximum of ", options_.max_members, " members"));
  }
  if (auto it = members_.find(id); it != members_.end() && it->second.principal != principal) {
    return absl::PermissionDeniedError(absl::StrCat("worker ", id, " registered as '",
                                                    it->second.principal, "'; '", principal,
                                                    "' cannot take its id"));
  }
  if (!start_.has_value()) {
    start_with_ =
        std::max(start_with_,
                 std::min<uint32_t>(req.start_with(), static_cast<uint32_t>(options_.max_members)));
  }
  Worker& w = members_[id];
  w.principal = principal;
  w.name = req.name().substr(0, 256);
  w.address = req.address().substr(0, 256);
  w.round = -1;
  w.last_seen = now;
  w.rounds_per_s = 0;
  Changed();
  v1::MemberRegisterReply reply;
  reply.set_worker_id(id);
  reply.set_epoch(epoch_);
  reply.set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  reply.set_heartbeat_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_timeout)));
  reply.set_topology(options_.topology);
  return reply;
}

absl::StatusOr<v1::HeartbeatReply> Membership::Heartbeat(const v1::HeartbeatRequest& req,
                                                         absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(req.worker_id());
  if (it == members_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", req.worker_id(),
                                            " is not a member (left, declared dead or never "
                                            "registered): register again"));
  }
  Worker& w = it->second;
  const double since = absl::ToDoubleSeconds(now - w.last_seen);
  // Over half an interval at least: two heartbeats close together (one was late) would
  // overstate the rate, and the lag with it. Not from a member still at round 0: its first
  // move may be a jump to where the group is (a joiner taking the group's state), not speed.
  if (w.round > 0 && req.round() >= w.round &&
      since >= 0.5 * absl::ToDoubleSeconds(options_.heartbeat_interval)) {
    const double rate = static_cast<double>(req.round() - w.round) / since;
    w.rounds_per_s = w.rounds_per_s == 0 ? rate : 0.5 * (w.rounds_per_s + rate);
  }
  w.last_seen = now;
  w.round = req.round();
  v1::HeartbeatReply reply;
  reply.set_epoch(epoch_);
  reply.set_from_round(from_round_);
  return reply;
}

v1::Member Membership::ToMember(uint32_t id, const Worker& w, absl::Time now) const {
  v1::Member m;
  m.set_id(id);
  m.set_name(w.name);
  m.set_address(w.address);
  m.set_round(w.round);
  m.set_silent_s(absl::ToDoubleSeconds(now - w.last_seen));
  return m;
}

absl::StatusOr<v1::View> Membership::GetView(uint32_t id, uint64_t round, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto self = members_.find(id);
  if (self == members_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", id, " is not a member: register again"));
  }
  v1::View v;
  v.set_epoch(epoch_);
  v.set_from_round(from_round_);
  v.set_round(round);
  v.set_topology(options_.topology);
  if (start_.has_value()) *v.mutable_start() = *start_;
  for (const v1::EpochRecord& r : recent_) {
    if (r.epoch() < epoch_) *v.add_recent() = r;
  }
  std::vector<uint32_t> ids;
  for (const auto& [mid, w] : members_) {
    ids.push_back(mid);
    *v.add_members() = ToMember(mid, w, now);
  }
  const int rank = static_cast<int>(std::distance(members_.begin(), self));
  v.set_rank(static_cast<uint32_t>(rank));
  absl::StatusOr<Graph> g =
      topology_->GraphFor(static_cast<int>(ids.size()), static_cast<int64_t>(round));
  if (!g.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "topology ", options_.topology, " over ", ids.size(), " members: ", g.status().message()));
  }
  TERN_ASSIGN_OR_RETURN(std::vector<MixingRow> rows, MixingWeights(*g, options_.weights));
  const MixingRow& row = rows[static_cast<size_t>(rank)];
  v.set_self_weight(row.self);
  for (const auto& [j, w] : row.neighbours) {
    v1::Neighbor* n = v.add_neighbors();
    n->set_id(ids[static_cast<size_t>(j)]);
    n->set_address(members_.at(ids[static_cast<size_t>(j)]).address);
    n->set_weight(w);
  }
  return v;
}

absl::StatusOr<v1::BarrierReply> Membership::Barrier(const v1::BarrierRequest& req) {
  absl::MutexLock lock(&mu_);
  if (!members_.count(req.worker_id())) {
    return absl::NotFoundError(
        absl::StrCat("worker ", req.worker_id(), " is not a member: register again"));
  }
  if (req.name().empty() || req.name().size() > 256) {
    return absl::InvalidArgumentError("a barrier needs a name of 1..256 bytes");
  }
  BarrierState& b = barriers_[req.name()];
  v1::BarrierReply reply;
  reply.set_epoch(epoch_);
  if (req.generation() == 0) {
    reply.set_generation(b.generation);
    b.arrived.insert(req.worker_id());
    reply.set_released(MaybeRelease(b));
  } else {
    if (req.generation() > b.generation) {
      return absl::InvalidArgumentError(
          absl::StrCat("barrier '", req.name(), "' has no generation ", req.generation(), " yet"));
    }
    reply.set_generation(req.generation());
    reply.set_released(b.generation > req.generation());
  }
  uint32_t waiting = 0;
  if (!reply.released()) {
    for (const auto& [id, w] : members_) waiting += b.arrived.count(id) ? 0 : 1;
  }
  reply.set_waiting_for(waiting);
  return reply;
}

absl::StatusOr<v1::MemberLeaveReply> Membership::Leave(uint32_t id) {
  absl::MutexLock lock(&mu_);
  if (members_.erase(id) == 0) {
    return absl::NotFoundError(absl::StrCat("worker ", id, " is not a member"));
  }
  Changed();
  v1::MemberLeaveReply reply;
  reply.set_epoch(epoch_);
  return reply;
}

v1::MembersReply Membership::Members(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  v1::MembersReply r;
  r.set_epoch(epoch_);
  r.set_from_round(from_round_);
  if (start_.has_value()) *r.mutable_start() = *start_;
  for (const auto& [id, w] : members_) *r.add_members() = ToMember(id, w, now);
  for (const v1::Failure& f : failures_) *r.add_failures() = f;
  r.set_heartbeat_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_timeout)));
  return r;
}

uint64_t Membership::failures_declared() const {
  absl::MutexLock lock(&mu_);
  return failures_declared_;
}

uint64_t Membership::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

std::vector<v1::Failure> Membership::Tick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Failure> dead;
  for (auto it = members_.begin(); it != members_.end();) {
    const absl::Duration silent = now - it->second.last_seen;
    if (silent <= options_.heartbeat_timeout) {
      ++it;
      continue;
    }
    v1::Failure f;
    f.set_id(it->first);
    f.set_name(it->second.name);
    f.set_detected_after_s(absl::ToDoubleSeconds(silent));
    dead.push_back(f);
    it = members_.erase(it);
  }
  if (dead.empty()) return dead;
  Changed();  // one epoch for every death of this tick
  for (v1::Failure& f : dead) {
    f.set_epoch(epoch_);
    failures_.push_back(f);
    ++failures_declared_;
  }
  while (failures_.size() > static_cast<size_t>(std::max(1, options_.keep_failures))) {
    failures_.pop_front();
  }
  return dead;
}

}  // namespace tern
