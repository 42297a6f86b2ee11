#include "server/service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "core/rpc/auth.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/chunked_request.h"
#include "core/rpc/server.h"
#include "core/rpc/status.h"
#include "grpcpp/alarm.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/metrics.h"
#include "spdlog/spdlog.h"
#include "tern/v1/server.grpc.pb.h"

namespace tern {

class AggregatorServer::Service final : public v1::Aggregator::CallbackService {
 public:
  explicit Service(AggregatorServer* s) : s_(s) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                 v1::JoinReply* reply) override {
    absl::Status st;
    const std::string principal = PrincipalOf(*ctx);
    *reply = s_->aggregator_->Join(*req, absl::Now(), &st, principal);
    if (st.ok()) {
      spdlog::info("server: client {} joined as '{}'{}{} ({} examples)", reply->client_id(),
                   req->name(), principal.empty() ? "" : ", authenticated as ", principal,
                   req->num_samples());
    } else {
      if (absl::IsPermissionDenied(st)) ++s_->permission_denied_;
      spdlog::warn("server: refused a join: {}", st.ToString());
    }
    return Done(ctx, st);
  }

  grpc::ServerReadReactor<v1::InitModelRequest>* InitModel(grpc::CallbackServerContext* ctx,
                                                           v1::InitModelReply* reply) override {
    return new InitModelCall(s_, ctx, reply);
  }

  grpc::ServerWriteReactor<v1::FetchReply>* Fetch(grpc::CallbackServerContext* ctx,
                                                  const v1::FetchRequest* req) override {
    return new FetchCall(s_, ctx, *req);
  }

  grpc::ServerReadReactor<v1::UpdateRequest>* Push(grpc::CallbackServerContext* ctx,
                                                   v1::UpdateReply* reply) override {
    return new PushCall(s_, ctx, reply);
  }

  grpc::ServerUnaryReactor* SecAgg(grpc::CallbackServerContext* ctx, const v1::SecAggRequest* req,
                                   v1::SecAggReply* reply) override {
    return new SecAggCall(s_, ctx, *req, reply);
  }

  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                  v1::LeaveReply*) override {
    if (absl::Status st = s_->Caller(*ctx, req->client_id()); !st.ok()) return Done(ctx, st);
    return Done(ctx, s_->aggregator_->Leave(req->client_id()));
  }

  grpc::ServerWriteReactor<v1::GetModelReply>* GetModel(grpc::CallbackServerContext*,
                                                        const v1::GetModelRequest* req) override {
    return new GetModelCall(s_, *req);
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest*,
                                   v1::ServerStatus* reply) override {
    *reply = s_->aggregator_->Status(absl::Now());
    return Done(ctx, absl::OkStatus());
  }

 private:
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(s));
    return r;
  }

  // InitModel: reassemble, then offer the bundle.
  class InitModelCall final
      : public ChunkedRequestReader<grpc::ServerReadReactor<v1::InitModelRequest>,
                                    v1::InitModelRequest> {
   public:
    InitModelCall(AggregatorServer* s, grpc::CallbackServerContext* ctx, v1::InitModelReply* reply)
        : ChunkedRequestReader(s->options_.max_bundle_bytes, "model"),
          s_(s),
          reply_(reply),
          principal_(PrincipalOf(*ctx)) {
      absl::StatusOr<std::unique_ptr<StreamLimits::Stream>> st = s->limits_->Open(ctx);
      if (!st.ok()) {
        Finish(ToGrpcStatus(st.status()));
        return;
      }
      stream_ = *std::move(st);
      StartReading(stream_.get());
    }
    absl::Status OnFirst(const v1::InitModelRequest& first) override {
      client_ = first.client_id();
      return s_->Caller(principal_, client_);
    }
    void OnBundle(v1::TensorBundle bundle) override {
      absl::StatusOr<bool> adopted = s_->aggregator_->InitModel(client_, bundle);
      if (adopted.ok()) {
        reply_->set_adopted(*adopted);
        if (*adopted) {
          spdlog::info("server: initial model from client {}", client_);
          s_->SizeBudget();
          s_->WakeFetches();
        }
      }
      Finish(ToGrpcStatus(adopted.status()));
    }
    void OnDone() override { delete this; }

   private:
    AggregatorServer* const s_;
    v1::InitModelReply* const reply_;
    std::unique_ptr<StreamLimits::Stream> stream_;
    const std::string principal_;
    uint32_t client_ = 0;
  };

  // What the long polls (Fetch, SecAgg) share: a call parks on FetchWaiters with an alarm set to
  // the end of its wait, and asks again (Poll, on the alarm's thread) when an event cancels the
  // alarm, the wait ends, the caller goes away or the server stops. Never finishes while its
  // alarm is pending.
  class LongPoll {
   public:
    virtual ~LongPoll() = default;

   protected:
    LongPoll(AggregatorServer* s, uint32_t max_wait_ms)
        : s_(s), until_(absl::Now() + absl::Milliseconds(std::min<uint32_t>(max_wait_ms, 30000))) {}
    // Asks the aggregator again; parks (Park) or finishes the call.
    virtual void Poll() = 0;
    // Whether the call may wait more: its wait not over, not cancelled, the server not stopping.
    bool MayWait() {
      absl::MutexLock lock(&mu_);
      return absl::Now() < until_ && !cancelled_ && !s_->stopping_;
    }
    // The reactor's OnCancel: the parked alarm fires now, Poll sees the cancellation.
    void CancelWait() {
      std::shared_ptr<FetchWaiters::Waiter> w;
      {
        absl::MutexLock lock(&mu_);
        cancelled_ = true;
        w = waiter_;
      }
      if (w != nullptr) w->alarm.Cancel();
    }
    // Parks under `client` unless an event came after `seen` (generation()). Once the alarm is
    // set its callback may run at once on another thread and finish the call; the extra
    // reference keeps this object alive until Park returns, and the call's context (which gRPC
    // frees with the call) is not touched after Set: the cancelled flag stands in for it.
    void Park(uint32_t client, uint64_t seen) {
      refs_.fetch_add(1);
      auto w = std::make_shared<FetchWaiters::Waiter>();
      {
        absl::MutexLock lock(&mu_);
        waiter_ = w;
      }
      w->alarm.Set(absl::ToChronoTime(until_), [this](bool) { Poll(); });
      bool cancelled;
      {
        absl::MutexLock lock(&mu_);  // OnCancel before this sees no alarm to cancel
        cancelled = cancelled_;
      }
      // An event since `seen`, a stop or a cancellation: ask again now.
      if (cancelled || !s_->fetch_waiters_.Park(client, w, seen) || s_->stopping_) {
        w->alarm.Cancel();
      }
      Unref();
    }
    // The reactor's OnDone drops gRPC's reference; a running Park holds the other.
    void Unref() {
      if (refs_.fetch_sub(1) == 1) delete this;
    }

    AggregatorServer* const s_;
    const absl::Time until_;

   private:
    absl::Mutex mu_;
    std::shared_ptr<FetchWaiters::Waiter> waiter_ ABSL_GUARDED_BY(mu_);  // the current wait
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
    std::atomic<int> refs_{1};
  };

  // Fetch: a long poll. Asks the aggregator; while the answer is WAIT, parks until the next
  // event (FetchWaiters), the end of the wait, the caller going away or the server stopping,
  // then asks again.
  class FetchCall final : public grpc::ServerWriteReactor<v1::FetchReply>, public LongPoll {
   public:
    FetchCall(AggregatorServer* s, grpc::CallbackServerContext* ctx, const v1::FetchRequest& req)
        : LongPoll(s, req.max_wait_ms()),
          ctx_(ctx),
          client_(req.client_id()),
          have_round_(req.have_round()),
          have_crc32_(req.have_crc32()),
          have_state_(req.have_optimizer_state()) {
      if (absl::Status st = s_->Caller(*ctx, client_); !st.ok()) {
        Finish(ToGrpcStatus(st));
        return;
      }
      Poll();
    }
    void OnWriteDone(bool ok) override { WriteNextOrFinish(this, ok, replies_, &next_); }
    void OnCancel() override { CancelWait(); }
    void OnDone() override { Unref(); }

   private:
    void Poll() override {
      const uint64_t seen = s_->fetch_waiters_.generation();
      absl::StatusOr<FetchResult> r =
          s_->aggregator_->Fetch(client_, absl::Now(), have_round_, have_crc32_, have_state_);
      if (!r.ok()) {
        Finish(ToGrpcStatus(r.status()));
        return;
      }
      const bool wait = r->task.kind() == v1::Task::WAIT;
      if (wait && !ctx_->IsCancelled() && MayWait()) {
        Park(client_, seen);
        return;
      }
      replies_.resize(r->chunks == nullptr ? 1 : r->chunks->size());
      *replies_[0].mutable_task() = r->task;
      if (r->chunks != nullptr) {
        for (size_t i = 0; i < r->chunks->size(); ++i) {
          *replies_[i].mutable_chunk() = (*r->chunks)[i];
        }
      }
      StartWrite(&replies_[0]);
    }

    grpc::CallbackServerContext* const ctx_;
    const uint32_t client_;
    const int64_t have_round_;
    const uint32_t have_crc32_;
    const bool have_state_;
    std::vector<v1::FetchReply> replies_;
    size_t next_ = 0;
  };

  // SecAgg: the stage's message, then a long poll for its answer as Fetch's: while the answer
  // is pending, parks until the next event (a stage closed), the end of the wait, the caller
  // going away or the server stopping, then asks again.
  class SecAggCall final : public grpc::ServerUnaryReactor, public LongPoll {
   public:
    SecAggCall(AggregatorServer* s, grpc::CallbackServerContext* ctx, const v1::SecAggRequest& req,
               v1::SecAggReply* reply)
        : LongPoll(s, req.max_wait_ms()), request_(req), reply_(reply) {
      if (absl::Status st = s_->Caller(*ctx, req.client_id()); !st.ok()) {
        Finish(ToGrpcStatus(st));
        return;
      }
      Poll();
    }
    void OnCancel() override { CancelWait(); }
    void OnDone() override { Unref(); }

   private:
    void Poll() override {
      const uint64_t seen = s_->fetch_waiters_.generation();
      absl::StatusOr<v1::SecAggReply> r = s_->aggregator_->SecAgg(request_, absl::Now());
      if (!r.ok()) {
        Finish(ToGrpcStatus(r.status()));
        return;
      }
      if (request_.message_case() != v1::SecAggRequest::MESSAGE_NOT_SET) {
        // A stage's last message closes it now, not at the next tick; sent once only.
        request_.clear_message();
        if (absl::Status t = s_->aggregator_->Tick(absl::Now()); !t.ok()) {
          spdlog::error("server: {}", t.ToString());
        }
        s_->WakeFetches();
        if (r->pending()) {  // it may have closed the stage: ask again at once
          Poll();
          return;
        }
      }
      if (r->pending() && MayWait()) {
        Park(request_.client_id(), seen);
        return;
      }
      *reply_ = *std::move(r);
      Finish(grpc::Status::OK);
    }

    v1::SecAggRequest request_;
    v1::SecAggReply* const reply_;
  };

  // Push: reassemble the update, then the aggregator judges and accumulates it.
  class PushCall final
      : public ChunkedRequestReader<grpc::ServerReadReactor<v1::UpdateRequest>, v1::UpdateRequest> {
   public:
    PushCall(AggregatorServer* s, grpc::CallbackServerContext* ctx, v1::UpdateReply* reply)
        // An update cannot be much larger than the model: a client cannot make the server
        // buffer gigabytes.
        : ChunkedRequestReader(
              std::min(s->options_.max_bundle_bytes, s->aggregator_->MaxUpdateBytes()), "update"),
          s_(s),
          reply_(reply),
          principal_(PrincipalOf(*ctx)) {
      absl::StatusOr<std::unique_ptr<StreamLimits::Stream>> st = s->limits_->Open(ctx);
      if (!st.ok()) {
        Fail(st.status());
        return;
      }
      stream_ = *std::move(st);
      // The bytes count against the budget until judged (Judge releases them).
      StartReading(stream_.get(), /*release_when_whole=*/false);
    }
    absl::Status OnFirst(const v1::UpdateRequest& first) override {
      if (!first.has_info()) {
        return absl::InvalidArgumentError("the first message must carry UpdateInfo");
      }
      info_ = first.info();
      // Before any of the update is held: nobody pushes in another client's name.
      return s_->Caller(principal_, info_.client_id());
    }
    void OnBundle(v1::TensorBundle bundle) override {
      // Judged on the server's push pool: a push waits for its log append's sync, and gRPC's
      // own threads must stay free to move other clients' bytes meanwhile.
      bundle_ = std::move(bundle);
      s_->push_pool_->Schedule([this] { Judge(); });
    }
    void Judge() {
      absl::StatusOr<v1::UpdateReply> r =
          s_->aggregator_->Push(info_, bundle_, wire_bytes(), absl::Now());
      stream_->ReleaseAll();
      if (!r.ok()) {
        spdlog::warn("server: refused an update from client {} for round {}: {}", info_.client_id(),
                     info_.round(), r.status().ToString());
        Finish(ToGrpcStatus(r.status()));
        return;
      }
      *reply_ = *r;
      // The last reply of a round closes it now rather than at the next tick (parameter-server
      // steps are one round each).
      if (absl::Status t = s_->aggregator_->Tick(absl::Now()); !t.ok()) {
        spdlog::error("server: {}", t.ToString());
      }
      s_->WakeFetches();
      Finish(grpc::Status::OK);
    }
    void OnDone() override { delete this; }

    void Fail(const absl::Status& st) override {
      spdlog::warn("server: refused an update stream: {}", st.ToString());
      Finish(ToGrpcStatus(st));
    }

   private:
    AggregatorServer* const s_;
    v1::UpdateReply* const reply_;
    std::unique_ptr<StreamLimits::Stream> stream_;
    const std::string principal_;
    v1::UpdateInfo info_;
    v1::TensorBundle bundle_;
  };

  class GetModelCall final : public grpc::ServerWriteReactor<v1::GetModelReply> {
   public:
    GetModelCall(AggregatorServer* s, const v1::GetModelRequest& req) {
      absl::Status st = Prepare(s, static_cast<int64_t>(req.round()));
      if (!st.ok()) {
        Finish(ToGrpcStatus(st));
      } else {
        StartWrite(&replies_[0]);
      }
    }
    void OnWriteDone(bool ok) override { WriteNextOrFinish(this, ok, replies_, &next_); }
    void OnDone() override { delete this; }

   private:
    absl::Status Prepare(AggregatorServer* s, int64_t round) {
      TERN_ASSIGN_OR_RETURN(Aggregator::KeptModel m, s->aggregator_->Model(round));
      TERN_ASSIGN_OR_RETURN(replies_, ChunkedReplies(*m.bundle, static_cast<uint64_t>(m.round),
                                                     &v1::GetModelReply::mutable_status, m.status));
      return absl::OkStatus();
    }
    std::vector<v1::GetModelReply> replies_;
    size_t next_ = 0;
  };

  AggregatorServer* const s_;
};

namespace {
constexpr uint64_t kMinAutoBudget = uint64_t{256} << 20;
// Pushes judged at once (each with a decoded copy of its update); most of them wait for the
// update log's shared sync, so more threads than cores.
constexpr int kPushThreads = 8;
}  // namespace

absl::StatusOr<std::unique_ptr<AggregatorServer>> AggregatorServer::Start(
    ServerOptions options, const ServerRegistries* registries) {
  std::shared_ptr<CallAuthenticator> authenticator;
  TERN_ASSIGN_OR_RETURN(auto credentials,
                        ServerCredentialsFor(options.tls, options.listen, &authenticator));
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Aggregator> agg,
                        Aggregator::Create(options.aggregator, registries, absl::Now()));
  std::unique_ptr<AggregatorServer> s(new AggregatorServer(std::move(options), std::move(agg)));
  s->authenticator_ = std::move(authenticator);
  s->SizeBudget();  // a restarted server knows its model already
  TERN_ASSIGN_OR_RETURN(s->server_, StartGrpcServer(s->options_.listen, {s->service_.get()},
                                                    &s->port_, std::move(credentials)));
  SetHealth(*s->server_, {v1::Aggregator::service_full_name()}, true);
  s->last_tick_ns_ = absl::ToUnixNanos(absl::Now());
  s->ticker_ = std::thread([p = s.get()] { p->TickerThread(); });
  if (!s->options_.metrics_listen.empty()) {
    AggregatorServer* p = s.get();
    TERN_ASSIGN_OR_RETURN(
        s->metrics_, MetricsEndpoint::Start(s->options_.metrics_listen, [p](MetricSet& m) {
          m.LabelEvery({{"run", p->options_.aggregator.run_id}});
          {
            absl::MutexLock lock(&p->round_mu_);
            CollectAggregatorMetrics(*p->aggregator_, p->round_seconds_, absl::Now(), m);
          }
          p->CollectCallerMetrics(m);
        }));
  }
  return s;
}

AggregatorServer::AggregatorServer(ServerOptions options, std::unique_ptr<Aggregator> aggregator)
    : options_(std::move(options)),
      aggregator_(std::move(aggregator)),
      limits_(std::make_unique<StreamLimits>([o = options_.limits]() mutable {
        if (o.max_buffered_bytes == 0) o.max_buffered_bytes = kMinAutoBudget;
        return o;
      }())),
      push_pool_(std::make_unique<ThreadPool>(kPushThreads)),
      service_(std::make_unique<Service>(this)) {}

void AggregatorServer::SizeBudget() {
  if (options_.limits.max_buffered_bytes != 0) return;
  limits_->SetMaxBufferedBytes(std::max(kMinAutoBudget, 16 * aggregator_->MaxUpdateBytes()));
}

AggregatorServer::~AggregatorServer() { Shutdown(absl::Seconds(1)); }

void AggregatorServer::TickerThread() {
  int64_t logged_round = -1;
  double closed_at = 0;  // when the round last seen closed
  absl::Time idle_since = absl::Now(), told = absl::InfinitePast();
  while (!stopping_) {
    absl::Status s = aggregator_->Tick(absl::Now());
    if (!s.ok()) spdlog::error("server: {}", s.ToString());
    WakeFetches();
    const v1::ServerStatus st = aggregator_->Counters();  // no O(clients) count each tick
    last_tick_ns_ = absl::ToUnixNanos(absl::Now());
    if (static_cast<int64_t>(st.round()) != logged_round && st.round() > 0) {
      if (logged_round >= 0 && closed_at > 0) {
        absl::MutexLock lock(&round_mu_);
        round_seconds_.Observe(st.round_closed_unix_s() - closed_at);
      }
      closed_at = st.round_closed_unix_s();
      logged_round = static_cast<int64_t>(st.round());
      spdlog::info("server: round {}/{} closed with {} updates, train loss {:.4f}", st.round(),
                   st.total_rounds(), st.last_round_updates(), st.train_loss());
      if (st.eval_round() == st.round()) {
        spdlog::info(
            "server: round {}: federated evaluation of the model it trained from: loss {:.4f}, "
            "accuracy {:.2f} % over {:.0f} examples of {} clients",
            st.round(), st.eval_loss(), 100 * st.eval_accuracy(), st.eval_examples(),
            st.eval_clients());
      }
    }
    if (st.done() && !done_.HasBeenNotified()) done_.Notify();
    if (st.round_open() || st.done()) {
      idle_since = absl::Now();
    } else if (absl::Now() - idle_since > absl::Seconds(5) &&
               absl::Now() - told > absl::Seconds(30)) {
      // Say why nothing happens: no round can open without enough live clients.
      told = absl::Now();
      spdlog::info("server: round {} waits for clients: {} joined, {} needed to open a round",
                   st.round() + 1, st.clients_joined(),
                   st.round() == 0 ? options_.aggregator.min_clients : 1);
    }
    absl::SleepFor(options_.tick);
  }
}

absl::Status AggregatorServer::Caller(const std::string& principal, uint32_t client) {
  absl::Status s = aggregator_->CheckCaller(client, principal);
  if (absl::IsPermissionDenied(s)) ++permission_denied_;
  if (!s.ok()) spdlog::warn("server: refused a call: {}", s.ToString());
  return s;
}

void AggregatorServer::CollectCallerMetrics(MetricSet& m) const {
  if (authenticator_ != nullptr) {
    m.CountersByReason("tern_server_calls_unauthenticated_total", kUnauthenticatedCallsHelp,
                       authenticator_->RefusalsByReason());
  }
  m.Counter("tern_server_calls_permission_denied_total",
            "Calls refused for acting in another client's name (its id joined as someone else).",
            static_cast<double>(permission_denied_.load()));
}

absl::Status AggregatorServer::Caller(const grpc::ServerContextBase& ctx, uint32_t client) {
  return Caller(PrincipalOf(ctx), client);
}

void AggregatorServer::WakeFetches() {
  const uint64_t events = aggregator_->events();
  uint64_t woken = woken_events_.load();
  while (woken < events) {
    if (woken_events_.compare_exchange_weak(woken, events)) {
      // Only the clients of the open round have a new answer (TRAIN), unless the run is done.
      if (aggregator_->done()) {
        fetch_waiters_.WakeAll();
      } else {
        const std::optional<std::vector<int>> clients = aggregator_->ClientsToWake();
        if (clients.has_value()) {
          fetch_waiters_.Wake(*clients);
        } else {
          fetch_waiters_.WakeAll();
        }
      }
      return;
    }
  }
}

void AggregatorServer::WaitDone() { done_.WaitForNotification(); }

void AggregatorServer::Shutdown(absl::Duration grace) {
  if (stopping_.exchange(true)) return;
  metrics_.reset();
  fetch_waiters_.WakeAll();  // parked long polls answer WAIT now
  if (ticker_.joinable()) ticker_.join();
  if (!done_.HasBeenNotified()) done_.Notify();
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    server_->Wait();
  }
}

}  // namespace tern
