#include "worker/gossip_service.h"

#include <atomic>
#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/chunking.h"
#include "common/status_macros.h"
#include "core/rpc/auth.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/chunked_request.h"
#include "core/rpc/raw_chunk.h"
#include "core/rpc/status.h"
#include "spdlog/spdlog.h"
#include "worker/stream_reply.h"

namespace tern {
namespace {

// Between a push's host and its caller's name in a stripe join's caller (hosts hold no spaces).
constexpr char kCallerSeparator[] = " ";

}  // namespace

// SwarmSGD: read the caller's model, answer with ours (RoundEngine::HandleSwap).
class GossipService::SwapCall final
    : public ChunkedRequestReader<grpc::ServerBidiReactor<v1::BundleChunk, v1::BundleChunk>,
                                  v1::BundleChunk> {
 public:
  SwapCall(GossipService* g, grpc::CallbackServerContext* ctx)
      : ChunkedRequestReader(g->options_.max_bundle_bytes, "bundle"),
        g_(g),
        principal_(PrincipalOf(*ctx)) {
    if (absl::Status c = g->Caller(*ctx); !c.ok()) {
      g->engine_->CountRefused(c);
      spdlog::warn("worker {}: refused a swap: {}", g->options_.worker_id, c.ToString());
      Finish(ToGrpcStatus(c));
      return;
    }
    absl::StatusOr<std::unique_ptr<StreamLimits::Stream>> s = g->limits_->Open(ctx);
    if (!s.ok()) {
      Finish(ToGrpcStatus(s.status()));
      return;
    }
    stream_ = *std::move(s);
    StartReading(stream_.get());
  }
  void OnBundle(v1::TensorBundle bundle) override {
    if (absl::Status who = g_->CheckSender(principal_, bundle); !who.ok()) {
      g_->engine_->CountRefused(who);
      Fail(who);
      return;
    }
    absl::StatusOr<v1::TensorBundle> reply =
        g_->engine_->HandleSwap(std::move(bundle), wire_bytes());
    absl::StatusOr<std::vector<v1::BundleChunk>> chunks =
        reply.ok() ? ChunkBundle(*reply, reply->round()) : reply.status();
    if (!chunks.ok()) {
      Fail(chunks.status());
      return;
    }
    out_ = *std::move(chunks);
    StartWrite(&out_[0]);
  }
  void Fail(const absl::Status& why) override {
    if (!absl::IsUnavailable(why)) {
      spdlog::warn("worker {}: refused a swap: {}", g_->options_.worker_id, why.ToString());
    }
    Finish(ToGrpcStatus(why));
  }
  void OnWriteDone(bool ok) override { WriteNextOrFinish(this, ok, out_, &next_); }
  void OnDone() override { delete this; }

 private:
  GossipService* const g_;
  const std::string principal_;
  std::unique_ptr<StreamLimits::Stream> stream_;
  std::vector<v1::BundleChunk> out_;
  size_t next_ = 0;
};

// Gossip.State: the published state's chunks, or why there is none yet.
class GossipService::StateCall final : public grpc::ServerWriteReactor<v1::BundleChunk> {
 public:
  StateCall(GossipService* g, grpc::CallbackServerContext* ctx, const v1::StateRequest& request) {
    absl::Status s = Prepare(g, *ctx, request);
    if (!s.ok()) {
      if (!absl::IsUnavailable(s)) {
        spdlog::warn("worker {}: refused a state request: {}", g->options_.worker_id, s.ToString());
      }
      Finish(ToGrpcStatus(s));
    } else {
      StartWrite(&out_[0]);
    }
  }
  void OnWriteDone(bool ok) override { WriteNextOrFinish(this, ok, out_, &next_); }
  void OnDone() override { delete this; }

 private:
  absl::Status Prepare(GossipService* g, const grpc::ServerContextBase& ctx,
                       const v1::StateRequest& request) {
    TERN_RETURN_IF_ERROR(g->CheckQuestion(ctx, request.run_id()));
    const int64_t min_step =
        static_cast<int64_t>(std::min<uint64_t>(request.min_step(), uint64_t{1} << 62));
    absl::StatusOr<std::shared_ptr<const PublishedState>> shared =
        g->engine_->SharedState(min_step);
    if (absl::IsUnavailable(shared.status()) && g->options_.post) {
      // Published at the next step's end; or by the round loop now, when no step is coming.
      RoundEngine* engine = g->engine_;
      g->options_.post([engine](bool cancelled) {
        if (!cancelled) engine->PublishWanted();
      });
    }
    TERN_ASSIGN_OR_RETURN(std::shared_ptr<const PublishedState> state, std::move(shared));
    const uint32_t slices = std::max<uint32_t>(request.slices(), 1);
    TERN_ASSIGN_OR_RETURN(v1::TensorBundle bundle,
                          GroupStateToBundle(*state, g->options_.run_id, g->options_.worker_id,
                                             request.slice(), slices));
    TERN_ASSIGN_OR_RETURN(out_, ChunkBundle(bundle, bundle.round()));
    spdlog::info("worker {}: sending the state after step {} (slice {} of {}) to '{}'",
                 g->options_.worker_id, bundle.round(), request.slice(), slices, PrincipalOf(ctx));
    return absl::OkStatus();
  }

  std::vector<v1::BundleChunk> out_;
  size_t next_ = 0;
};

// One Gossip.Push stream: a whole bundle, or one stripe of a striped push (StripeJoins).
class GossipService::PushCall final : public grpc::ServerReadReactor<grpc::ByteBuffer>,
                                      public StripeMember {
 public:
  PushCall(GossipService* g, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* reply,
           StripeJoins* joins)
      : g_(g),
        ctx_(ctx),
        reply_(reply),
        joins_(joins),
        scans_(g->codecs_),
        assembler_(g->options_.max_bundle_bytes, &scans_) {
    absl::StatusOr<std::unique_ptr<StreamLimits::Stream>> s = g->Admit(ctx);
    if (!s.ok()) {
      Refuse(s.status());
      return;
    }
    stream_ = *std::move(s);
    StartRead(&message_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      if (join_ == nullptr) {
        Refuse(absl::InvalidArgumentError("stream ended before the bundle's last chunk"));
      } else if (std::optional<absl::Status> outcome = join_->EndOfStream(this)) {
        Answer(*outcome);
      }  // else JoinDone answers
      return;
    }
    absl::StatusOr<RawChunk> chunk = ParseRawChunk(message_);
    message_.Clear();
    if (!chunk.ok()) {
      Refuse(chunk.status());
      return;
    }
    if (join_ != nullptr || chunk->header.stripes > 1) {
      Striped(*std::move(chunk));
      return;
    }
    wire_bytes_ += chunk->message_size + 5;
    std::optional<absl::StatusOr<ReceivedBundle>> got = FeedCounted(*stream_, assembler_, *chunk);
    if (!got) {
      StartRead(&message_);
      return;
    }
    if (!got->ok()) {
      Refuse(got->status());
      return;
    }
    Answer(g_->DeliverPushed(PrincipalOf(*ctx_), *std::move(got), wire_bytes_, &scans_));
  }
  void JoinDone(const absl::Status& outcome) override { Answer(outcome); }
  // A stream waiting on its join's other stripes has no read to fail: it answers here.
  void OnCancel() override {
    std::shared_ptr<StripeJoin> join;
    {
      absl::MutexLock lock(&join_mu_);  // OnCancel may run beside a read's callback
      cancelled_ = true;
      join = join_;
    }
    if (join != nullptr && join->Leave(this, absl::CancelledError("stream cancelled"))) {
      Answer(absl::CancelledError("stream cancelled while its push's other stripes came"));
    }
  }
  void OnDone() override {
    if (join_ != nullptr) join_->Leave(this, absl::CancelledError("stream ended"));
    delete this;
  }

 private:
  // A chunk of one stripe: into the push's join, counted against this stream's limits.
  void Striped(RawChunk chunk) {
    if (join_ == nullptr) {
      absl::StatusOr<std::shared_ptr<StripeJoin>> join = joins_->Attach(
          absl::StrCat(PeerHost(ctx_->peer()), kCallerSeparator, PrincipalOf(*ctx_)), chunk.header);
      if (!join.ok()) {
        Refuse(join.status());
        return;
      }
      bool cancelled;
      {
        absl::MutexLock lock(&join_mu_);
        join_ = *std::move(join);
        cancelled = cancelled_;
      }
      // OnCancel ran while this first chunk was on its way here, and found no join to leave:
      // its stream, waiting later for the others, would never be answered (its slot held and
      // the server's shutdown waiting for it). It leaves now; the join's outcome answers it.
      if (cancelled) join_->Leave(this, absl::CancelledError("stream cancelled"));
    }
    std::optional<absl::Status> outcome;
    if (absl::Status s = stream_->Hold(chunk.data_size); !s.ok()) {
      join_->Leave(this, s);
      outcome = s;
    } else {
      outcome = join_->Add(std::move(chunk));
    }
    if (outcome) {
      Answer(*outcome);
    } else {
      StartRead(&message_);
    }
  }

  // Finishes the RPC with `s` and the receiver's round; once, whichever path gets here first.
  void Answer(const absl::Status& s) {
    if (answered_.exchange(true)) return;
    stream_->ReleaseAll();
    v1::PushReply reply;
    reply.set_receiver_round(static_cast<uint64_t>(g_->engine_->next_step()));
    grpc::Slice bytes(reply.SerializeAsString());
    *reply_ = grpc::ByteBuffer(&bytes, 1);
    Finish(ToGrpcStatus(s));
  }

  // Refuses the stream; one of a join fails the join, whose outcome counts and logs it.
  void Refuse(const absl::Status& s) {
    if (join_ != nullptr) {
      join_->Leave(this, s);
    } else {
      g_->RefusedStream(s);
    }
    if (answered_.exchange(true)) return;
    Finish(ToGrpcStatus(s));
  }

  GossipService* const g_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const reply_;
  StripeJoins* const joins_;
  std::unique_ptr<StreamLimits::Stream> stream_;
  PayloadScans scans_;  // the payloads checked as they arrive; before the assembler feeding it
  BundleAssembler assembler_;
  // A striped push's, from its first chunk on. Set once by the read path, which reads it
  // without the lock; OnCancel, which may run beside it, reads it under the lock.
  absl::Mutex join_mu_;
  std::shared_ptr<StripeJoin> join_;
  bool cancelled_ ABSL_GUARDED_BY(join_mu_) = false;  // OnCancel has run
  grpc::ByteBuffer message_;
  uint64_t wire_bytes_ = 0;
  std::atomic<bool> answered_{false};
};

// One Gossip.Stream: message after message from one neighbour, each handed to the engine as a
// Push's and answered on the stream. The next read starts once the answer is written, so at most
// one message is under way. A chunk that cannot be taken ends the stream: where the next message
// would start in the bytes after it is not known.
class GossipService::StreamCall final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamCall(GossipService* g, grpc::CallbackServerContext* ctx)
      : g_(g), principal_(PrincipalOf(*ctx)) {
    absl::StatusOr<std::unique_ptr<StreamLimits::Stream>> s = g->Admit(ctx);
    if (!s.ok()) {
      End(s.status());
      return;
    }
    stream_ = *std::move(s);
    NextMessage();
    StartRead(&message_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {  // the sender closed its side (or the call ended)
      if (mid_message_) {
        End(absl::InvalidArgumentError("stream ended before a message's last chunk"));
      } else {
        Finish(grpc::Status::OK);
      }
      return;
    }
    absl::StatusOr<RawChunk> chunk = ParseRawChunk(message_);
    message_.Clear();
    if (!chunk.ok()) {
      End(chunk.status());
      return;
    }
    if (chunk->header.stripes > 1) {
      End(absl::InvalidArgumentError("a stripe of a striped push on Gossip.Stream (use Push)"));
      return;
    }
    mid_message_ = true;
    wire_bytes_ += chunk->message_size + 5;
    if (absl::Status held = stream_->Hold(chunk->data_size); !held.ok()) {
      End(held);
      return;
    }
    if (absl::Status added = assembler_->Add(chunk->header, chunk->data, chunk->owner);
        !added.ok()) {
      End(added);
      return;
    }
    if (!assembler_->complete()) {
      StartRead(&message_);
      return;
    }
    // The message's bytes are all here: whatever the engine says, the stream goes on.
    absl::StatusOr<ReceivedBundle> got = assembler_->FinishInPlace();
    stream_->ReleaseAll();
    const absl::Status verdict =
        g_->DeliverPushed(principal_, std::move(got), wire_bytes_, scans_.get());
    reply_ = StreamReplyMessage(verdict, g_->engine_->next_step());
    NextMessage();
    StartWrite(&reply_);
  }
  void OnWriteDone(bool ok) override {
    if (ok) {
      StartRead(&message_);
    } else {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the sender went away"));
    }
  }
  void OnDone() override { delete this; }

 private:
  void NextMessage() {
    mid_message_ = false;
    wire_bytes_ = 0;
    assembler_.reset();  // before the scans it observes with
    scans_ = std::make_unique<PayloadScans>(g_->codecs_);
    assembler_ = std::make_unique<BundleAssembler>(g_->options_.max_bundle_bytes, scans_.get());
  }
  // Ends the stream with `s`, counted and logged as a refused stream.
  void End(const absl::Status& s) {
    g_->RefusedStream(s);
    if (stream_ != nullptr) stream_->ReleaseAll();
    Finish(ToGrpcStatus(s));
  }

  GossipService* const g_;
  const std::string principal_;
  std::unique_ptr<StreamLimits::Stream> stream_;
  std::unique_ptr<PayloadScans> scans_;  // the message's payloads checked as they arrive
  std::unique_ptr<BundleAssembler> assembler_;
  bool mid_message_ = false;  // a chunk of the message under way came
  uint64_t wire_bytes_ = 0;
  grpc::ByteBuffer message_;
  grpc::ByteBuffer reply_;
};

GossipService::GossipService(GossipServiceOptions options, RoundEngine* engine,
                             StreamLimits* limits, const CodecRegistry* codecs)
    : options_(std::move(options)),
      engine_(engine),
      limits_(limits),
      codecs_(codecs),
      joins_(codecs, options_.max_bundle_bytes,
             [this](const std::string& caller, absl::StatusOr<ReceivedBundle> got,
                    uint64_t wire_bytes, PayloadScans* scans) {
               return DeliverPushed(caller.substr(caller.find(kCallerSeparator) + 1),
                                    std::move(got), wire_bytes, scans);
             }) {}

grpc::ServerReadReactor<grpc::ByteBuffer>* GossipService::Push(grpc::CallbackServerContext* ctx,
                                                               grpc::ByteBuffer* reply) {
  return new PushCall(this, ctx, reply, &joins_);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* GossipService::Stream(
    grpc::CallbackServerContext* ctx) {
  return new StreamCall(this, ctx);
}

grpc::ServerBidiReactor<v1::BundleChunk, v1::BundleChunk>* GossipService::Swap(
    grpc::CallbackServerContext* ctx) {
  return new SwapCall(this, ctx);
}

grpc::ServerUnaryReactor* GossipService::Position(grpc::CallbackServerContext* ctx,
                                                  const v1::PositionRequest* request,
                                                  v1::PositionReply* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = CheckQuestion(*ctx, request->run_id());
  // Under --peer_names only the worker the caller's name binds it to speaks for it.
  const int sender = static_cast<int>(std::min<uint32_t>(request->sender(), 1u << 30));
  const bool bound = options_.peer_names.empty() || WorkerIdOf(PrincipalOf(*ctx)) == sender;
  if (s.ok() && bound) engine_->PeerListening(sender);
  if (s.ok() && request->back_from() > 0) {
    if (!bound) {
      s = absl::PermissionDeniedError(
          absl::StrCat("'", PrincipalOf(*ctx), "' may not say that worker ", sender, " is back"));
    } else {
      s = engine_->PeerBack(sender, static_cast<int64_t>(std::min<uint64_t>(request->back_from(),
                                                                            uint64_t{1} << 62)));
    }
  }
  if (s.ok()) {
    reply->set_next_step(static_cast<uint64_t>(engine_->next_step()));
    reply->set_rounds_mixed(static_cast<uint64_t>(engine_->rounds_mixed()));
  }
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerWriteReactor<v1::BundleChunk>* GossipService::State(grpc::CallbackServerContext* ctx,
                                                                const v1::StateRequest* request) {
  return new StateCall(this, ctx, *request);
}

absl::Status GossipService::CheckQuestion(const grpc::ServerContextBase& ctx,
                                          const std::string& run_id) const {
  TERN_RETURN_IF_ERROR(Caller(ctx));
  if (run_id != options_.run_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("asked about run '", run_id, "'; this worker is in '", options_.run_id, "'"));
  }
  return absl::OkStatus();
}

absl::Status GossipService::Caller(const grpc::ServerContextBase& ctx) const {
  const std::string who = PrincipalOf(ctx);
  if (PrincipalAllowed(options_.peer_names, who)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("'", who, "' may not gossip into this worker (--peer_names=",
                   absl::StrJoin(options_.peer_names, ","), ")"));
}

absl::StatusOr<std::unique_ptr<StreamLimits::Stream>> GossipService::Admit(
    grpc::CallbackServerContext* ctx) const {
  TERN_RETURN_IF_ERROR(Caller(*ctx));
  return limits_->Open(ctx);
}

absl::Status GossipService::CheckSender(const std::string& principal,
                                        const v1::TensorBundle& bundle) const {
  if (options_.peer_names.empty()) return absl::OkStatus();
  const std::optional<int> bound = WorkerIdOf(principal);
  if (!bound.has_value()) {
    return absl::PermissionDeniedError(
        absl::StrCat("'", principal, "' binds to no worker id: under --peer_names a caller's name ",
                     "ends in the id of the worker it is (worker-3)"));
  }
  if (bundle.sender() != absl::StrCat(*bound)) {
    return absl::PermissionDeniedError(absl::StrCat("'", principal, "' sent as worker '",
                                                    bundle.sender(), "'; its name makes it worker ",
                                                    *bound));
  }
  return absl::OkStatus();
}

void GossipService::RefusedStream(const absl::Status& s) {
  engine_->CountRefused(s);
  spdlog::warn("worker {}: refused a gossip stream: {}", options_.worker_id, s.ToString());
}

absl::Status GossipService::DeliverPushed(const std::string& principal,
                                          absl::StatusOr<ReceivedBundle> got, uint64_t wire_bytes,
                                          PayloadScans* scans) {
  if (got.ok()) {
    if (absl::Status who = CheckSender(principal, got->bundle); !who.ok()) got = who;
  }
  if (!got.ok()) {
    RefusedStream(got.status());
    return got.status();
  }
  // Deliver takes the bundle over (its payloads move, not copy); keep what the log needs.
  const std::string sender = got->bundle.sender();
  const uint64_t round = got->bundle.round();
  absl::Status s = engine_->Deliver(*std::move(got), wire_bytes, scans);
  if (absl::IsUnavailable(s)) {
    spdlog::debug("worker {}: not ready for '{}' round {}: {}", options_.worker_id, sender, round,
                  s.ToString());
  } else if (!s.ok()) {
    spdlog::warn("worker {}: refused a message from '{}' for round {}: {}", options_.worker_id,
                 sender, round, s.ToString());
  }
  return s;
}

}  // namespace tern
