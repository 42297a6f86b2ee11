#include "worker/scheduler_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/status.h"
#include "spdlog/spdlog.h"

namespace tern {
namespace {

// An epoch's member ids as the scheduler lists them.
std::vector<int> Ids(const google::protobuf::RepeatedField<uint32_t>& ids) {
  return std::vector<int>(ids.begin(), ids.end());
}

}  // namespace

absl::StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Start(
    std::shared_ptr<grpc::Channel> channel, SchedulerClientOptions options, absl::Duration wait) {
  std::unique_ptr<SchedulerClient> c(new SchedulerClient(std::move(channel), std::move(options)));
  const absl::Time until = absl::Now() + wait;
  for (bool told = false;;) {
    absl::Status s = c->Register();
    if (s.ok()) break;
    // Every id taken: a worker that died frees its id once the scheduler declares it dead.
    const bool full = absl::IsResourceExhausted(s) && c->options_.worker_id < 0;
    if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s) && !full) return s;
    if (absl::Now() > until) return s;
    if (full && !told) {
      spdlog::info("scheduler: {}; waiting up to {} for a free id", std::string(s.message()),
                   absl::FormatDuration(wait));
      told = true;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  c->thread_ = std::thread([p = c.get()] { p->HeartbeatLoop(); });
  return c;
}

SchedulerClient::SchedulerClient(std::shared_ptr<grpc::Channel> channel,
                                 SchedulerClientOptions options)
    : options_(std::move(options)), stub_(v1::Scheduler::NewStub(channel)) {
  absl::MutexLock lock(&mu_);
  address_ = options_.address;
}

SchedulerClient::~SchedulerClient() { Stop(false); }

void SchedulerClient::Deadline(grpc::ClientContext* ctx, absl::Duration extra) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout + extra));
}

absl::Status SchedulerClient::Register() {
  v1::MemberRegisterRequest req;
  req.set_run_id(options_.run_id);
  req.set_name(options_.name);
  req.set_ids_below(options_.ids_below);
  req.set_start_with(options_.start_with);
  {
    absl::MutexLock lock(&mu_);
    req.set_address(address_);
    // After the first registration, ask for the same id back.
    req.set_worker_id(registered_ ? static_cast<int64_t>(id_) : options_.worker_id);
  }
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::MemberRegisterReply reply;
  TERN_RETURN_IF_ERROR(FromGrpcStatus(stub_->Register(&ctx, req, &reply)));
  {
    absl::MutexLock lock(&mu_);
    id_ = reply.worker_id();
    registered_ = true;
    registered_at_ = absl::Now();
    registered_epoch_ = reply.epoch();
  }
  interval_ms_ = std::max<uint32_t>(10, reply.heartbeat_interval_ms());
  spdlog::info(
      "scheduler: registered as worker {} (epoch {}, heartbeat every {} ms, timeout {} ms)",
      reply.worker_id(), reply.epoch(), reply.heartbeat_interval_ms(),
      reply.heartbeat_timeout_ms());
  return absl::OkStatus();
}

void SchedulerClient::Follow(uint64_t epoch, int64_t from_round) {
  const int64_t round = options_.progress ? options_.progress() : 0;
  absl::StatusOr<v1::View> v = View(static_cast<uint64_t>(std::max<int64_t>(from_round, round)));
  if (!v.ok()) {
    spdlog::warn("scheduler: view of epoch {}: {}", epoch, v.status().ToString());
    return;
  }
  Epoch e{v->epoch(), v->from_round(), {}};
  std::vector<std::string> nbrs;
  for (const v1::Member& m : v->members()) e.members.push_back(static_cast<int>(m.id()));
  for (const v1::Neighbor& n : v->neighbors()) nbrs.push_back(absl::StrCat(n.id()));
  spdlog::info("scheduler: epoch {} from round {}: members [{}], neighbours [{}]", e.epoch,
               e.from_round, absl::StrJoin(e.members, ","), absl::StrJoin(nbrs, ","));
  if (options_.on_members) {
    options_.on_members(std::vector<v1::Member>(v->members().begin(), v->members().end()));
  }
  absl::MutexLock lock(&mu_);
  epoch_ = std::max(epoch_, v->epoch());
  if (options_.start_with > 0 && v->has_start()) Started(v->start());
  // The epochs since the last one followed, each from its own round: two that came between
  // heartbeats (two joins close together) must not be taken as one, or this worker would mix
  // over another graph than its peers in the rounds between their from_rounds.
  for (const v1::EpochRecord& r : v->recent()) {
    Record(Epoch{r.epoch(), r.from_round(), Ids(r.members())});
  }
  Record(std::move(e));
}

void SchedulerClient::Record(Epoch e) {
  if (!epochs_.empty() && epochs_.back().epoch >= e.epoch) return;
  if (options_.start_with == 0 && static_cast<int>(e.members.size()) >= options_.expected_members) {
    formed_ = true;
  }
  if (!formed_) return;  // still starting: the static configuration holds
  epochs_.push_back(std::move(e));
  if (epochs_.size() > 64) epochs_.erase(epochs_.begin());
}

void SchedulerClient::HeartbeatLoop() {
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(interval_ms_.load()))) {
    v1::HeartbeatRequest req;
    {
      absl::MutexLock lock(&mu_);
      req.set_worker_id(id_);
    }
    req.set_round(options_.progress ? options_.progress() : -1);
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::HeartbeatReply reply;
    grpc::Status s = stub_->Heartbeat(&ctx, req, &reply);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      // Declared dead (we were too slow) or the scheduler restarted: come back with our id.
      spdlog::warn("scheduler: {}; registering again", s.error_message());
      if (absl::Status r = Register(); !r.ok()) spdlog::warn("scheduler: {}", r.ToString());
      continue;
    }
    if (!s.ok()) {
      spdlog::debug("scheduler: heartbeat: {}", s.error_message());
      continue;
    }
    uint64_t known;
    {
      absl::MutexLock lock(&mu_);
      known = epoch_;
    }
    if (reply.epoch() != known) Follow(reply.epoch(), reply.from_round());
  }
}

uint32_t SchedulerClient::id() const {
  absl::MutexLock lock(&mu_);
  return id_;
}

uint64_t SchedulerClient::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

void SchedulerClient::Started(const v1::RunStart& start) {
  if (formed_) return;
  formed_ = true;
  Epoch first{start.epoch(), 0, Ids(start.members())};
  std::erase_if(epochs_, [&](const Epoch& e) { return e.epoch <= first.epoch; });
  epochs_.insert(epochs_.begin(), std::move(first));
  spdlog::info("scheduler: the run started with workers [{}] (epoch {})",
               absl::StrJoin(epochs_.front().members, ","), start.epoch());
}

std::optional<int64_t> SchedulerClient::MemberFrom() const {
  absl::MutexLock lock(&mu_);
  if (!formed_ || epochs_.empty()) return std::nullopt;
  const int me = static_cast<int>(id_);
  const auto member = [me](const Epoch& e) {
    return std::binary_search(e.members.begin(), e.members.end(), me);
  };
  // The oldest epoch of the newest unbroken run with this worker in it, since it registered
  // (before that, its peers may have had no address, or an old one, for it).
  std::optional<int64_t> from;
  for (auto it = epochs_.rbegin(); it != epochs_.rend() && member(*it); ++it) {
    if (it->epoch < registered_epoch_) break;
    from = it->from_round;
  }
  return from;
}

std::optional<std::vector<int>> SchedulerClient::MembersFor(int64_t round) const {
  absl::MutexLock lock(&mu_);
  for (auto it = epochs_.rbegin(); it != epochs_.rend(); ++it) {
    if (it->from_round <= round) return it->members;
  }
  return std::nullopt;
}

absl::Status SchedulerClient::Advertise(const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    if (address_ == address) return absl::OkStatus();
    address_ = address;
  }
  return Register();
}

absl::StatusOr<std::vector<std::string>> SchedulerClient::WaitForPeers(
    int workers, absl::Duration wait, const std::function<bool()>& stopped) {
  const absl::Time deadline = absl::Now() + wait;
  std::string missing;
  for (bool first = true;; first = false) {
    v1::MembersReply reply;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    const absl::Status s = FromGrpcStatus(stub_->Members(&ctx, v1::MembersRequest(), &reply));
    std::vector<std::string> addresses(static_cast<size_t>(workers));
    if (s.ok()) {
      for (const v1::Member& m : reply.members()) {
        if (m.id() < addresses.size()) addresses[m.id()] = m.address();
      }
      if (options_.start_with > 0) {
        // Elastic: the run has started (the members it started with had addresses then); the
        // ones to come are followed epoch by epoch.
        if (reply.has_start()) {
          missing.clear();
          absl::MutexLock lock(&mu_);
          Started(reply.start());
        } else {
          int with = 0;
          for (const v1::Member& m : reply.members()) with += m.address().empty() ? 0 : 1;
          missing = absl::StrCat("the run starts with ", options_.start_with, " workers; ", with,
                                 " registered (with an address) yet");
        }
      } else {
        std::vector<int> absent;
        for (int i = 0; i < workers; ++i) {
          if (addresses[static_cast<size_t>(i)].empty()) absent.push_back(i);
        }
        missing = absent.empty() ? ""
                                 : absl::StrCat("workers [", absl::StrJoin(absent, ","),
                                                "] not registered (with an address) yet");
      }
    } else {
      missing = absl::StrCat("the scheduler: ", s.ToString());
    }
    absl::Time settled;
    {
      absl::MutexLock lock(&mu_);
      settled = registered_at_ + 2 * absl::Milliseconds(interval_ms_.load());
    }
    if (missing.empty() && absl::Now() >= settled) return addresses;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no peers from the scheduler after ", absl::FormatDuration(wait), ": ",
                       missing.empty() ? "its members had not heard this worker" : missing));
    }
    if (stopped()) return absl::CancelledError("stopped while waiting for peers");
    if (first && !missing.empty()) {
      spdlog::info("scheduler: waiting up to {} for peers: {}", absl::FormatDuration(wait),
                   missing);
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<v1::View> SchedulerClient::View(uint64_t round) {
  v1::ViewRequest req;
  req.set_worker_id(id());
  req.set_round(round);
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::View v;
  TERN_RETURN_IF_ERROR(FromGrpcStatus(stub_->GetView(&ctx, req, &v)));
  return v;
}

absl::Status SchedulerClient::Barrier(const std::string& name, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  v1::BarrierRequest req;
  req.set_worker_id(id());
  req.set_name(name);
  while (true) {
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("barrier '", name, "' not released"));
    }
    req.set_max_wait_ms(static_cast<uint32_t>(
        std::min<int64_t>(10000, std::max<int64_t>(1, absl::ToInt64Milliseconds(left)))));
    grpc::ClientContext ctx;
    Deadline(&ctx, absl::Milliseconds(req.max_wait_ms()));
    v1::BarrierReply reply;
    TERN_RETURN_IF_ERROR(FromGrpcStatus(stub_->Barrier(&ctx, req, &reply)));
    if (reply.released()) return absl::OkStatus();
    req.set_generation(reply.generation());  // keep waiting without arriving again
  }
}

void SchedulerClient::Stop(bool leave) {
  if (stopped_.exchange(true)) return;
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
  if (!leave) return;
  v1::MemberLeaveRequest req;
  req.set_worker_id(id());
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::MemberLeaveReply reply;
  grpc::Status s = stub_->Leave(&ctx, req, &reply);
  if (!s.ok()) spdlog::debug("scheduler: leave: {}", s.error_message());
}

}  // namespace tern
