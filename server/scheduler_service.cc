#include "server/scheduler_service.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "core/rpc/auth.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/server.h"
#include "core/rpc/status.h"
#include "grpcpp/alarm.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/metrics.h"
#include "spdlog/spdlog.h"
#include "tern/v1/scheduler.grpc.pb.h"

namespace tern {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(10);
constexpr uint32_t kMaxWaitMs = 30000;

// A unary long poll: calls `poll` until it says done (or errs), the wait is over, the caller
// goes away or the server stops; never finishes while an alarm is pending.
class LongPoll final : public grpc::ServerUnaryReactor {
 public:
  // Returns OK + true when the reply is final, OK + false to poll again.
  using PollFn = std::function<absl::StatusOr<bool>()>;
  // `done` runs once the call is over (it gives back the call's waiting slot).
  LongPoll(grpc::CallbackServerContext* ctx, uint32_t max_wait_ms,
           const std::atomic<bool>* stopping, PollFn poll, std::function<void()> done)
      : ctx_(ctx),
        stopping_(stopping),
        poll_(std::move(poll)),
        done_(std::move(done)),
        until_(absl::Now() + absl::Milliseconds(std::min(max_wait_ms, kMaxWaitMs))) {
    Poll();
  }
  void OnDone() override {
    done_();
    delete this;
  }

 private:
  void Poll() {
    absl::StatusOr<bool> done = poll_();
    if (!done.ok()) {
      Finish(ToGrpcStatus(done.status()));
      return;
    }
    if (!*done && absl::Now() < until_ && !ctx_->IsCancelled() && !stopping_->load()) {
      alarm_.Set(absl::ToChronoTime(absl::Now() + kPollInterval), [this](bool) { Poll(); });
      return;
    }
    Finish(grpc::Status::OK);
  }

  grpc::CallbackServerContext* const ctx_;
  const std::atomic<bool>* const stopping_;
  const PollFn poll_;
  const std::function<void()> done_;
  const absl::Time until_;
  grpc::Alarm alarm_;
};

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpcStatus(s));
  return r;
}

}  // namespace

class SchedulerServer::Service final : public v1::Scheduler::CallbackService {
 public:
  explicit Service(SchedulerServer* s) : s_(s), m_(s->membership_.get()) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::MemberRegisterRequest* req,
                                     v1::MemberRegisterReply* reply) override {
    absl::StatusOr<v1::MemberRegisterReply> r = m_->Register(*req, absl::Now(), PrincipalOf(*ctx));
    if (r.ok()) {
      *reply = *r;
      spdlog::info("scheduler: worker {} registered as '{}' at '{}'; epoch {}", r->worker_id(),
                   req->name(), req->address(), r->epoch());
      if (std::optional<v1::RunStart> start = m_->start();
          start.has_value() && start->epoch() == r->epoch()) {
        spdlog::info("scheduler: the run starts with workers [{}] (epoch {}); later ones join it",
                     absl::StrJoin(start->members(), ","), start->epoch());
      }
    } else {
      if (absl::IsPermissionDenied(r.status())) ++s_->permission_denied_;
      spdlog::warn("scheduler: refused a registration: {}", r.status().ToString());
    }
    return Done(ctx, r.status());
  }

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatReply* reply) override {
    if (absl::Status c = Caller(*ctx, req->worker_id()); !c.ok()) return Done(ctx, c);
    absl::StatusOr<v1::HeartbeatReply> r = m_->Heartbeat(*req, absl::Now());
    if (r.ok()) *reply = *r;
    return Done(ctx, r.status());
  }

  grpc::ServerUnaryReactor* GetView(grpc::CallbackServerContext* ctx, const v1::ViewRequest* req,
                                    v1::View* reply) override {
    const v1::ViewRequest q = *req;
    Membership* m = m_;
    return Wait(ctx, q.worker_id(), q.max_wait_ms(), [m, q, reply]() -> absl::StatusOr<bool> {
      TERN_ASSIGN_OR_RETURN(*reply, m->GetView(q.worker_id(), q.round(), absl::Now()));
      return reply->epoch() > q.after_epoch();
    });
  }

  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx, const v1::BarrierRequest* req,
                                    v1::BarrierReply* reply) override {
    if (absl::Status c = Caller(*ctx, req->worker_id()); !c.ok()) return Done(ctx, c);
    // Arrive once, then wait on the generation arrived at.
    auto q = std::make_shared<v1::BarrierRequest>(*req);
    Membership* m = m_;
    return Wait(ctx, q->worker_id(), q->max_wait_ms(), [m, q, reply]() -> absl::StatusOr<bool> {
      TERN_ASSIGN_OR_RETURN(*reply, m->Barrier(*q));
      q->set_generation(reply->generation());
      return reply->released();
    });
  }

  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx,
                                  const v1::MemberLeaveRequest* req,
                                  v1::MemberLeaveReply* reply) override {
    if (absl::Status c = Caller(*ctx, req->worker_id()); !c.ok()) return Done(ctx, c);
    absl::StatusOr<v1::MemberLeaveReply> r = m_->Leave(req->worker_id());
    if (r.ok()) {
      *reply = *r;
      spdlog::info("scheduler: worker {} left; epoch {}", req->worker_id(), r->epoch());
    }
    return Done(ctx, r.status());
  }

  grpc::ServerUnaryReactor* Members(grpc::CallbackServerContext* ctx, const v1::MembersRequest*,
                                    v1::MembersReply* reply) override {
    *reply = m_->Members(absl::Now());
    return Done(ctx, absl::OkStatus());
  }

 private:
  // Nobody heartbeats, arrives at a barrier or leaves in another member's name.
  absl::Status Caller(const grpc::ServerContextBase& ctx, uint32_t id) {
    absl::Status s = m_->CheckCaller(id, PrincipalOf(ctx));
    if (!s.ok()) {
      ++s_->permission_denied_;
      spdlog::warn("scheduler: refused a call: {}", s.ToString());
    }
    return s;
  }
  // A long poll for `worker`, if a waiting slot is free.
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, uint32_t worker,
                                 uint32_t max_wait_ms, LongPoll::PollFn poll) {
    if (absl::Status admitted = s_->Admit(worker); !admitted.ok()) return Done(ctx, admitted);
    SchedulerServer* s = s_;
    return new LongPoll(ctx, max_wait_ms, &s_->stopping_, std::move(poll),
                        [s, worker] { s->Release(worker); });
  }

  SchedulerServer* const s_;
  Membership* const m_;
};

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(
    SchedulerServerOptions options, const TopologyRegistry& topologies) {
  std::shared_ptr<CallAuthenticator> authenticator;
  TERN_ASSIGN_OR_RETURN(auto credentials,
                        ServerCredentialsFor(options.tls, options.listen, &authenticator));
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Membership> m,
                        Membership::Create(options.scheduler, topologies));
  std::unique_ptr<SchedulerServer> s(new SchedulerServer(std::move(options), std::move(m)));
  s->authenticator_ = std::move(authenticator);
  TERN_ASSIGN_OR_RETURN(s->server_, StartGrpcServer(s->options_.listen, {s->service_.get()},
                                                    &s->port_, std::move(credentials)));
  SetHealth(*s->server_, {v1::Scheduler::service_full_name()}, true);
  s->last_tick_ns_ = absl::ToUnixNanos(absl::Now());
  s->ticker_ = std::thread([p = s.get()] { p->TickerThread(); });
  if (!s->options_.metrics_listen.empty()) {
    SchedulerServer* p = s.get();
    TERN_ASSIGN_OR_RETURN(s->metrics_,
                          MetricsEndpoint::Start(s->options_.metrics_listen, [p](MetricSet& set) {
                            set.LabelEvery({{"run", p->options_.scheduler.run_id}});
                            int waiting;
                            {
                              absl::MutexLock lock(&p->wait_mu_);
                              waiting = p->waiting_;
                            }
                            CollectSchedulerMetrics(*p->membership_, waiting, absl::Now(), set);
                            p->CollectCallerMetrics(set);
                          }));
  }
  return s;
}

void SchedulerServer::CollectCallerMetrics(MetricSet& m) const {
  if (authenticator_ != nullptr) {
    m.CountersByReason("tern_scheduler_calls_unauthenticated_total", kUnauthenticatedCallsHelp,
                       authenticator_->RefusalsByReason());
  }
  m.Counter("tern_scheduler_calls_permission_denied_total",
            "Calls refused for acting in another member's name (its id registered as someone "
            "else).",
            static_cast<double>(permission_denied_.load()));
}

SchedulerServer::SchedulerServer(SchedulerServerOptions options,
                                 std::unique_ptr<Membership> membership)
    : options_(std::move(options)),
      membership_(std::move(membership)),
      service_(std::make_unique<Service>(this)) {}

SchedulerServer::~SchedulerServer() { Shutdown(absl::Seconds(1)); }

absl::Status SchedulerServer::Admit(uint32_t worker) {
  absl::MutexLock lock(&wait_mu_);
  if (waiting_ >= options_.max_waiting_calls) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the scheduler has ", waiting_, " calls waiting, its limit (--max_waiting_calls=",
        options_.max_waiting_calls, "); retry later"));
  }
  // Looked up, not inserted: a refused call must leave no entry behind.
  auto it = waiting_by_worker_.find(worker);
  const int mine = it == waiting_by_worker_.end() ? 0 : it->second;
  if (mine >= options_.max_waiting_per_worker) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "worker ", worker, " has ", mine, " calls waiting, its limit (--max_waiting_per_worker=",
        options_.max_waiting_per_worker, ")"));
  }
  ++waiting_by_worker_[worker];
  ++waiting_;
  return absl::OkStatus();
}

void SchedulerServer::Release(uint32_t worker) {
  absl::MutexLock lock(&wait_mu_);
  --waiting_;
  auto it = waiting_by_worker_.find(worker);
  if (it != waiting_by_worker_.end() && --it->second == 0) waiting_by_worker_.erase(it);
}

void SchedulerServer::TickerThread() {
  while (!stopping_) {
    last_tick_ns_ = absl::ToUnixNanos(absl::Now());
    for (const v1::Failure& f : membership_->Tick(absl::Now())) {
      spdlog::warn("scheduler: worker {} ('{}') silent for {:.2f} s: declared dead; epoch {}",
                   f.id(), f.name(), f.detected_after_s(), f.epoch());
    }
    absl::SleepFor(options_.tick);
  }
}

void SchedulerServer::Shutdown(absl::Duration grace) {
  if (stopping_.exchange(true)) return;
  metrics_.reset();
  if (ticker_.joinable()) ticker_.join();
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    server_->Wait();
  }
}

}  // namespace tern
