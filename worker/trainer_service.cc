#include "worker/trainer_service.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/chunking.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "core/rpc/auth.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/chunked_request.h"
#include "core/rpc/status.h"
#include "spdlog/spdlog.h"

namespace tern {
namespace {

grpc::Status Unavailable() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is shutting down");
}

}  // namespace

class TrainerService::RegisterCall final
    : public ChunkedRequestReader<grpc::ServerReadReactor<v1::RegisterRequest>,
                                  v1::RegisterRequest> {
 public:
  RegisterCall(TrainerService* s, v1::RegisterReply* reply)
      : ChunkedRequestReader(s->options_.max_bundle_bytes, "model"), s_(s), reply_(reply) {
    StartReading();
  }
  void OnBundle(v1::TensorBundle bundle) override {
    s_->options_.post([this, b = std::move(bundle)](bool cancelled) {
      if (cancelled) {
        Finish(Unavailable());
        return;
      }
      Finish(ToGrpcStatus(Run(b)));
    });
  }
  void OnDone() override { delete this; }

 private:
  // A job of the loop: decode the model, register it.
  absl::Status Run(const v1::TensorBundle& b) {
    s_->port_->AssertHeld();
    TERN_ASSIGN_OR_RETURN(std::vector<ParamTensor> layout,
                          LayoutFromBundle(b, s_->options_.max_params));
    std::vector<float> x0(LayoutNumel(layout));
    TERN_RETURN_IF_ERROR(BundleToFlat(b, layout, *s_->codecs_, absl::MakeSpan(x0)));
    TERN_ASSIGN_OR_RETURN(*reply_, s_->port_->RegisterLocked(layout, x0));
    return absl::OkStatus();
  }

  TrainerService* const s_;
  v1::RegisterReply* const reply_;
};

class TrainerService::StepCall final
    : public ChunkedRequestReader<grpc::ServerBidiReactor<v1::StepRequest, v1::StepReply>,
                                  v1::StepRequest> {
 public:
  explicit StepCall(TrainerService* s)
      : ChunkedRequestReader(s->options_.max_bundle_bytes, "gradient"), s_(s) {
    StartReading();
  }
  absl::Status OnFirst(const v1::StepRequest& first) override {
    if (!first.has_info()) {
      return absl::InvalidArgumentError("the first StepRequest must carry StepInfo");
    }
    info_ = first.info();
    return absl::OkStatus();
  }
  void OnBundle(v1::TensorBundle bundle) override {
    s_->options_.post([this, b = std::move(bundle)](bool cancelled) {
      if (cancelled) {
        Finish(Unavailable());
        return;
      }
      absl::Status s = Run(b);
      if (!s.ok()) {
        Finish(ToGrpcStatus(s));
        return;
      }
      StartWrite(&replies_[0]);
    });
  }
  void OnWriteDone(bool ok) override { WriteNextOrFinish(this, ok, replies_, &next_); }
  void OnDone() override { delete this; }

 private:
  // A job of the loop: decode the gradient, run the step, stage the reply.
  absl::Status Run(const v1::TensorBundle& b) {
    s_->port_->AssertHeld();
    RoundEngine* e = s_->engine_;
    if (!e->initialized()) return absl::FailedPreconditionError("register the model first");
    std::vector<ParamTensor> layout = e->layout();
    std::vector<float> grad(LayoutNumel(layout));
    TERN_RETURN_IF_ERROR(BundleToFlat(b, layout, *s_->codecs_, absl::MakeSpan(grad)));
    StepInput in = StepInputOf(info_);
    in.grad = grad;
    TERN_ASSIGN_OR_RETURN(StepOutcome out, s_->port_->StepLocked(in));
    const v1::StepResult result = StepResultOf(out);
    TERN_ASSIGN_OR_RETURN(v1::TensorBundle params, FlatToBundle(layout, e->params()));
    params.set_round(static_cast<uint64_t>(out.step));
    TERN_ASSIGN_OR_RETURN(replies_, ChunkedReplies(params, static_cast<uint64_t>(out.step),
                                                   &v1::StepReply::mutable_result, result));
    return absl::OkStatus();
  }

  TrainerService* const s_;
  v1::StepInfo info_;
  std::vector<v1::StepReply> replies_;
  size_t next_ = 0;
};

class TrainerService::SnapshotCall final : public grpc::ServerWriteReactor<v1::SnapshotReply> {
 public:
  SnapshotCall(RoundEngine* engine, const v1::SnapshotRequest& request) {
    absl::Status s = Prepare(engine, static_cast<int64_t>(request.round()));
    if (!s.ok()) {
      Finish(ToGrpcStatus(s));
    } else {
      StartWrite(&replies_[0]);
    }
  }
  void OnWriteDone(bool ok) override { WriteNextOrFinish(this, ok, replies_, &next_); }
  void OnDone() override { delete this; }

 private:
  absl::Status Prepare(RoundEngine* e, int64_t step) {
    v1::WorkerStats stats = e->Stats();  // before the snapshot, so they never run ahead of it
    TERN_ASSIGN_OR_RETURN(std::vector<float> x, e->GetSnapshot(step));
    TERN_ASSIGN_OR_RETURN(v1::TensorBundle b, FlatToBundle(e->layout(), x));
    b.set_round(static_cast<uint64_t>(step));
    TERN_ASSIGN_OR_RETURN(replies_, ChunkedReplies(b, static_cast<uint64_t>(step),
                                                   &v1::SnapshotReply::mutable_stats, stats));
    return absl::OkStatus();
  }

  std::vector<v1::SnapshotReply> replies_;
  size_t next_ = 0;
};

namespace {

// A call refused before it started: finishes with `why` and goes.
template <typename Reactor>
class RefusedCall final : public Reactor {
 public:
  explicit RefusedCall(const absl::Status& why) { this->Finish(ToGrpcStatus(why)); }
  void OnDone() override { delete this; }
};

}  // namespace

absl::Status TrainerService::Caller(const grpc::CallbackServerContext& ctx) const {
  const std::string who = PrincipalOf(ctx);
  const bool allowed = options_.trainer_names.empty()
                           ? IsLocalPeer(ctx.peer())
                           : PrincipalAllowed(options_.trainer_names, who);
  if (allowed) return absl::OkStatus();
  const absl::Status refused = absl::PermissionDeniedError(absl::StrCat(
      "'", who, "' (", ctx.peer(), ") is not this worker's trainer: ",
      options_.trainer_names.empty()
          ? std::string("only a caller on its host may be (--trainer_names names others)")
          : absl::StrCat("--trainer_names=", absl::StrJoin(options_.trainer_names, ","))));
  engine_->CountRefused(refused);
  spdlog::warn("trainer service: refused a call: {}", std::string(refused.message()));
  return refused;
}

grpc::ServerReadReactor<v1::RegisterRequest>* TrainerService::Register(
    grpc::CallbackServerContext* ctx, v1::RegisterReply* reply) {
  if (absl::Status c = Caller(*ctx); !c.ok()) {
    return new RefusedCall<grpc::ServerReadReactor<v1::RegisterRequest>>(c);
  }
  return new RegisterCall(this, reply);
}

grpc::ServerBidiReactor<v1::StepRequest, v1::StepReply>* TrainerService::Step(
    grpc::CallbackServerContext* ctx) {
  if (absl::Status c = Caller(*ctx); !c.ok()) {
    return new RefusedCall<grpc::ServerBidiReactor<v1::StepRequest, v1::StepReply>>(c);
  }
  return new StepCall(this);
}

grpc::ServerWriteReactor<v1::SnapshotReply>* TrainerService::Snapshot(
    grpc::CallbackServerContext* ctx, const v1::SnapshotRequest* request) {
  if (absl::Status c = Caller(*ctx); !c.ok()) {
    return new RefusedCall<grpc::ServerWriteReactor<v1::SnapshotReply>>(c);
  }
  return new SnapshotCall(engine_, *request);
}

grpc::ServerUnaryReactor* TrainerService::Stats(grpc::CallbackServerContext* ctx,
                                                const v1::StatsRequest*, v1::WorkerStats* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status c = Caller(*ctx); !c.ok()) {
    reactor->Finish(ToGrpcStatus(c));
    return reactor;
  }
  *reply = engine_->Stats();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::OpenSharedMemory(grpc::CallbackServerContext* ctx,
                                                           const v1::OpenSharedMemoryRequest*,
                                                           v1::SharedMemoryInfo* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status c = Caller(*ctx); !c.ok()) {
    reactor->Finish(ToGrpcStatus(c));
    return reactor;
  }
  options_.post([segment = segment_, reactor, reply](bool cancelled) {
    if (cancelled) {
      reactor->Finish(Unavailable());
      return;
    }
    absl::StatusOr<v1::SharedMemoryInfo> info = segment->Open();
    if (info.ok()) *reply = *std::move(info);
    reactor->Finish(ToGrpcStatus(info.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::StepShared(grpc::CallbackServerContext* ctx,
                                                     const v1::StepInfo* request,
                                                     v1::StepResult* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status c = Caller(*ctx); !c.ok()) {
    reactor->Finish(ToGrpcStatus(c));
    return reactor;
  }
  options_.post([segment = segment_, reactor, request, reply](bool cancelled) {
    if (cancelled) {
      reactor->Finish(Unavailable());
      return;
    }
    absl::StatusOr<v1::StepResult> r = segment->Step(*request);
    if (r.ok()) *reply = *std::move(r);
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  return reactor;
}

}  // namespace tern
