#include "worker/grpc_transport.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/raw_chunk.h"
#include "core/rpc/status.h"
#include "grpcpp/alarm.h"
#include "spdlog/spdlog.h"

namespace tern {

namespace {

// Gossip.Push, called as a raw stream (a client-streaming method is a stream either way).
const std::string& PushMethod() {
  static const std::string* const kMethod =
      new std::string(absl::StrCat("/", v1::Gossip::service_full_name(), "/Push"));
  return *kMethod;
}

}  // namespace

// One attempt at a push of a bundle over one stream, or over several (a striped push): each
// stream a PushCall, owned here. The first stream to fail cancels the others (the receiver would
// otherwise hold them, waiting for chunks that will not come). Once every stream has ended, a push
// refused as UNAVAILABLE is tried again whole by a successor, with a new stream id, after a
// backoff (under kRetryUnavailable, while the deadline leaves room); otherwise `done` gets the
// first stream's error, or OK. Deletes itself, and its calls, when the last stream has ended.
class GrpcTransport::Push {
 public:
  Push(GrpcTransport* transport, std::vector<grpc::GenericStub*> stubs, Chunks chunks,
       absl::Time deadline, Reach reach, absl::Duration backoff,
       std::function<void(absl::Status)> done)
      : transport_(transport),
        stubs_(std::move(stubs)),
        chunks_(std::move(chunks)),
        deadline_(deadline),
        reach_(reach),
        backoff_(backoff),
        done_(std::move(done)) {}
  ~Push();

  void Start();
  // Starts this attempt after `delay` (the alarm lives in the attempt, which outlives it).
  void StartAfter(absl::Duration delay) {
    alarm_.Set(absl::ToChronoTime(absl::Now() + delay), [this](bool) { Start(); });
  }
  // A stream's end (from its OnDone).
  void StreamDone(const absl::Status& s);

 private:
  // Drops one hold on the attempt (a stream's, or Start's own); the last decides.
  void Release();
  // Cancels every stream (those already ended ignore it). REQUIRES: all started, a hold kept.
  void CancelAll();
  void Done(const absl::Status& status);

  GrpcTransport* const transport_;
  const std::vector<grpc::GenericStub*> stubs_;  // one per stream
  const Chunks chunks_;
  const absl::Time deadline_;
  const Reach reach_;
  const absl::Duration backoff_;
  std::function<void(absl::Status)> done_;
  grpc::Alarm alarm_;
  // Made by Start before any is started, then not changed: read without the lock.
  std::vector<std::unique_ptr<PushCall>> calls_;
  absl::Mutex mu_;
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // every call started
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// One Gossip.Push stream: chunks first, first + step, ... of the push's bundle, marked with
// `stripe` when the push is striped. Its Push owns it and frees it after OnDone.
class GrpcTransport::PushCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PushCall(Push* push, grpc::GenericStub* stub, Chunks chunks, size_t first, size_t step,
           std::optional<ChunkStripe> stripe, absl::Time deadline, bool wait_for_ready)
      : push_(push),
        stub_(stub),
        chunks_(std::move(chunks)),
        next_(first),
        step_(step),
        stripe_(stripe) {
    ctx_.set_deadline(absl::ToChronoTime(deadline));
    ctx_.set_wait_for_ready(wait_for_ready);
  }

  void Start() {
    stub_->PrepareBidiStreamingCall(&ctx_, PushMethod(), grpc::StubOptions(), this);
    StartRead(&reply_);  // the PushReply, once the receiver has taken the whole bundle
    WriteNextOrDone();
    StartCall();
  }
  // Any time, also before Start or after OnDone (then it does nothing).
  void Cancel() { ctx_.TryCancel(); }

  void OnWriteDone(bool ok) override {
    if (ok) WriteNextOrDone();  // else the stream broke; OnDone brings the status
  }
  void OnReadDone(bool) override {}
  // The last thing this call does: its Push may free it.
  void OnDone(const grpc::Status& s) override { push_->StreamDone(FromGrpcStatus(s)); }

 private:
  // Each chunk's data goes out from the shared chunks themselves, which the message keeps alive.
  // The last chunk goes with the half-close (one frame and one callback fewer).
  void WriteNextOrDone() {
    if (next_ >= chunks_->size()) {
      if (chunks_->empty()) StartWritesDone();
      return;
    }
    out_ = RawChunkMessage((*chunks_)[next_], chunks_, stripe_ ? &*stripe_ : nullptr);
    next_ += step_;
    if (next_ >= chunks_->size()) {
      StartWriteLast(&out_, grpc::WriteOptions());
    } else {
      StartWrite(&out_);
    }
  }

  Push* const push_;
  grpc::GenericStub* const stub_;
  const Chunks chunks_;
  size_t next_;
  const size_t step_;
  const std::optional<ChunkStripe> stripe_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer out_;
  grpc::ByteBuffer reply_;
};

GrpcTransport::Push::~Push() = default;

void GrpcTransport::Push::Start() {
  const size_t k = stubs_.size();
  std::optional<ChunkStripe> stripe;
  if (k > 1) stripe = ChunkStripe{transport_->NewStreamId(), static_cast<uint32_t>(k)};
  // Stream i carries chunks i, i + k, i + 2k, ...: the receiver's parse position moves on as
  // the streams deliver side by side, and few chunks wait for it.
  for (size_t i = 0; i < k; ++i) {
    calls_.push_back(std::make_unique<PushCall>(this, stubs_[i], chunks_, i, k, stripe, deadline_,
                                                reach_ == Reach::kWaitForReady));
  }
  {
    absl::MutexLock lock(&mu_);
    holds_ = static_cast<int>(k) + 1;  // Start's own hold keeps calls_ while it starts them
  }
  for (const std::unique_ptr<PushCall>& c : calls_) c->Start();
  bool cancel = false;
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
    cancel = !status_.ok() && calls_.size() > 1;
  }
  if (cancel) CancelAll();
  Release();
}

void GrpcTransport::Push::CancelAll() {
  for (const std::unique_ptr<PushCall>& c : calls_) c->Cancel();
}

void GrpcTransport::Push::StreamDone(const absl::Status& s) {
  bool cancel = false;
  {
    absl::MutexLock lock(&mu_);
    if (status_.ok() && !s.ok()) {
      status_ = s;
      // Calls are cancelled only once all are started (Start cancels them if this comes first):
      // cancelling while Start was still starting them left a push waiting forever, once in
      // about a dozen bench runs.
      cancel = started_ && calls_.size() > 1;
    }
  }
  // This stream's hold keeps the calls alive while the others are cancelled.
  if (cancel) CancelAll();
  Release();
}

void GrpcTransport::Push::Release() {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (--holds_ > 0) return;
    status = status_;
  }
  Done(status);
}

void GrpcTransport::Push::Done(const absl::Status& status) {
  // The calls go before the push counts as ended: each holds its channel, and once the transport
  // may go (Drain returns) the call freed last would drop its channel's last reference here, on
  // gRPC's callback thread, freeing the completion queue that thread runs on (libgrpc aborts).
  calls_.clear();
  if (absl::IsUnavailable(status) && !IsSitOut(status) && reach_ == Reach::kRetryUnavailable &&
      absl::Now() + backoff_ < deadline_) {
    auto* next = new Push(transport_, stubs_, chunks_, deadline_, reach_,
                          std::min(backoff_ * 2, absl::Milliseconds(500)), std::move(done_));
    next->StartAfter(backoff_);
  } else {
    done_(status);
    transport_->Finished();
  }
  delete this;
}

absl::Status GrpcTransport::SetPeers(const std::vector<std::string>& addresses, bool absent_ok) {
  if (self_ < 0 || static_cast<size_t>(self_) >= addresses.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker id ", self_, " is not in the list of ", addresses.size(), " peers"));
  }
  std::vector<Peer> peers(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (static_cast<int>(i) == self_ || (absent_ok && addresses[i].empty())) continue;
    if (addresses[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("peer ", i, " has no address"));
    }
    peers[i] = MakePeer(addresses[i]);
  }
  absl::MutexLock lock(&mu_);
  if (!peers_.empty()) return absl::FailedPreconditionError("peers are already set");
  peers_ = std::move(peers);
  return absl::OkStatus();
}

GrpcTransport::Peer GrpcTransport::MakePeer(const std::string& address) const {
  Peer p;
  p.address = address;
  std::shared_ptr<grpc::Channel> channel = MakeChannel(address, ChannelKind::kPeer, credentials_);
  p.stub = v1::Gossip::NewStub(channel);
  p.raw.push_back(std::make_unique<grpc::GenericStub>(channel));
  p.channels.push_back(std::move(channel));
  // Channels connect on their first call: a peer never sent a large push costs no connection.
  for (int c = 1; c < striping_.stripes; ++c) {
    p.channels.push_back(MakeChannel(address, ChannelKind::kPeer, credentials_, /*connection=*/c));
    p.raw.push_back(std::make_unique<grpc::GenericStub>(p.channels.back()));
  }
  return p;
}

absl::StatusOr<bool> GrpcTransport::SetPeer(int to, const std::string& address) {
  if (to == self_ || address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", to, " at '", address, "': not a peer's address"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (peers_.empty()) return absl::FailedPreconditionError("peers are not set yet");
    if (to < 0 || static_cast<size_t>(to) >= peers_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", to, " is not in the list of ", peers_.size(), " peers"));
    }
    if (peers_[to].address == address) return false;
  }
  Peer fresh = MakePeer(address);  // channels are made outside the lock
  absl::MutexLock lock(&mu_);
  if (peers_[to].address == address) return false;
  spdlog::info("worker {}: peer {} is now at {} (was {})", self_, to, address, peers_[to].address);
  replaced_.push_back(std::exchange(peers_[to], std::move(fresh)));
  return true;
}

bool GrpcTransport::has_peers() const {
  absl::MutexLock lock(&mu_);
  return !peers_.empty();
}

void GrpcTransport::Send(int to, Chunks chunks, absl::Time deadline, Reach reach,
                         std::function<void(absl::Status)> done) {
  const uint64_t bytes = chunks->empty() ? 0 : chunks->front().total_size();
  std::vector<grpc::GenericStub*> stubs;
  {
    absl::MutexLock lock(&mu_);
    if (to >= 0 && static_cast<size_t>(to) < peers_.size() && !peers_[to].raw.empty()) {
      const size_t k = bytes >= striping_.min_bytes ? peers_[to].raw.size() : 1;
      for (size_t i = 0; i < std::min(k, std::max<size_t>(chunks->size(), 1)); ++i) {
        stubs.push_back(peers_[to].raw[i].get());
      }
      ++in_flight_;
    }
  }
  if (stubs.empty()) {
    done(absl::UnavailableError(absl::StrCat("no address for worker ", to)));
    return;
  }
  (new Push(this, std::move(stubs), std::move(chunks), deadline, reach, absl::Milliseconds(20),
            std::move(done)))
      ->Start();
}

void GrpcTransport::Reconnect(int to) {
  // A channel that failed to connect (the peer was down) fails calls at once until its backoff
  // (a second or more) runs out: a peer that is back would miss the rounds in between.
  absl::MutexLock lock(&mu_);
  if (to < 0 || static_cast<size_t>(to) >= peers_.size()) return;
  for (const auto& channel : peers_[to].channels) {
    grpc::experimental::ChannelResetConnectionBackoff(channel.get());
  }
}

uint64_t GrpcTransport::NewStreamId() {
  absl::MutexLock lock(&mu_);
  return stream_ids_();
}

absl::StatusOr<v1::Gossip::Stub*> GrpcTransport::StubOf(int to) const {
  absl::MutexLock lock(&mu_);
  if (to < 0 || static_cast<size_t>(to) >= peers_.size() || peers_[to].stub == nullptr) {
    return absl::UnavailableError(absl::StrCat("no address for worker ", to));
  }
  return peers_[to].stub.get();
}

absl::StatusOr<PeerTransport::Position> GrpcTransport::AskPosition(int to,
                                                                   const std::string& run_id,
                                                                   int64_t back_from,
                                                                   absl::Time deadline) {
  TERN_ASSIGN_OR_RETURN(v1::Gossip::Stub * stub, StubOf(to));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::PositionRequest req;
  req.set_run_id(run_id);
  req.set_sender(static_cast<uint32_t>(self_));
  req.set_back_from(static_cast<uint64_t>(std::max<int64_t>(back_from, 0)));
  v1::PositionReply reply;
  TERN_RETURN_IF_ERROR(FromGrpcStatus(stub->Position(&ctx, req, &reply)));
  constexpr uint64_t kMost = uint64_t{1} << 62;
  return Position{.next_step = static_cast<int64_t>(std::min(reply.next_step(), kMost)),
                  .rounds_mixed = static_cast<int64_t>(std::min(reply.rounds_mixed(), kMost))};
}

absl::StatusOr<v1::TensorBundle> GrpcTransport::FetchState(int to, const std::string& run_id,
                                                           int64_t min_step, uint32_t slice,
                                                           uint32_t slices, absl::Time deadline) {
  TERN_ASSIGN_OR_RETURN(v1::Gossip::Stub * stub, StubOf(to));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  v1::StateRequest req;
  req.set_run_id(run_id);
  req.set_min_step(static_cast<uint64_t>(std::max<int64_t>(min_step, 0)));
  if (slices > 1) {
    req.set_slice(slice);
    req.set_slices(slices);
  }
  auto stream = stub->State(&ctx, req);
  absl::StatusOr<v1::TensorBundle> state = ReadChunkedBundle<v1::BundleChunk>(stream.get());
  TERN_RETURN_IF_ERROR(FromGrpcStatus(stream->Finish()));  // the peer's refusal, if any
  return state;
}

absl::StatusOr<v1::TensorBundle> GrpcTransport::Swap(int to, Chunks chunks, absl::Time deadline) {
  TERN_ASSIGN_OR_RETURN(v1::Gossip::Stub * stub, StubOf(to));
  // The round loop is the caller and has nothing else to do meanwhile: a blocking call.
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  auto stream = stub->Swap(&ctx);
  for (const v1::BundleChunk& c : *chunks) {
    if (!stream->Write(c)) break;
  }
  stream->WritesDone();
  absl::StatusOr<v1::TensorBundle> reply = ReadChunkedBundle<v1::BundleChunk>(stream.get());
  TERN_RETURN_IF_ERROR(FromGrpcStatus(stream->Finish()));  // the partner's refusal, if any
  return reply;
}

void GrpcTransport::Finished() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

void GrpcTransport::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &in_flight_));
}

}  // namespace tern
