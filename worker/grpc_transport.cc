#include "worker/grpc_transport.h"

#include <algorithm>
#include <deque>
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
#include "worker/stream_reply.h"

namespace tern {

namespace {

// Gossip.Push, called as a raw stream (a client-streaming method is a stream either way).
const std::string& PushMethod() {
  static const std::string* const kMethod =
      new std::string(absl::StrCat("/", v1::Gossip::service_full_name(), "/Push"));
  return *kMethod;
}

// Gossip.Stream, called as a raw stream.
const std::string& StreamMethod() {
  static const std::string* const kMethod =
      new std::string(absl::StrCat("/", v1::Gossip::service_full_name(), "/Stream"));
  return *kMethod;
}

// Whether a stream the peer ended with `s` ended over the message it was reading (a chunk it could
// not take): then `s` is that message's verdict, as a Push of it would have had. Anything else
// (the connection, a shutdown, a peer without the method) says nothing about the message.
bool RefusesTheMessage(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return true;
    default:
      return false;
  }
}

// A push refused as UNAVAILABLE is tried again after this, doubling up to kMaxBackoff.
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(20);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(500);

// Whether a message answered `verdict` is tried again (after a backoff) rather than done: a peer
// still starting up, while its reach says so and its deadline leaves room.
bool RetryLater(const absl::Status& verdict, PeerTransport::Reach reach, absl::Time deadline,
                absl::Duration backoff) {
  return absl::IsUnavailable(verdict) && !IsSitOut(verdict) &&
         reach == PeerTransport::Reach::kRetryUnavailable && absl::Now() + backoff < deadline;
}

// How long a stream's call may run past the end of its life, for the answers still owed then.
// A message is answered in well under a second as a rule; one still unanswered when the call's
// deadline comes goes as a Push (each message's own deadline is kept by the stream's alarm).
constexpr absl::Duration kAnswerSpan = absl::Minutes(5);

}  // namespace

struct GrpcTransport::Message {
  Chunks chunks;
  absl::Time deadline;
  Reach reach;
  std::function<void(absl::Status)> done;
};

// One long-lived Gossip.Stream to a peer: messages written one after another (one write in
// flight), answered in order. It takes messages for its life; once idle after that it
// half-closes, and the peer ends the call. When the call ends, each message still unanswered
// goes as a Push of its own (the Push brings the verdict), or fails DEADLINE_EXCEEDED when its
// deadline has passed; an alarm at the earliest deadline of those unanswered cancels the call
// when one passes, as a Push call's own deadline would end it.
//
// Thread-safety: thread-safe. Owned by shared_ptr, whose deleter tells the transport it is
// gone; it holds itself from Start until OnDone.
class GrpcTransport::PeerStream final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public std::enable_shared_from_this<PeerStream> {
 public:
  PeerStream(GrpcTransport* transport, int to, grpc::GenericStub* stub, absl::Duration life)
      : transport_(transport),
        to_(to),
        accept_until_(absl::Now() + life),
        call_deadline_(accept_until_ + kAnswerSpan) {
    ctx_.set_deadline(absl::ToChronoTime(call_deadline_));
    stub->PrepareBidiStreamingCall(&ctx_, StreamMethod(), grpc::StubOptions(), this);
  }

  // Whether a message may go on this stream now.
  bool Takes() const { return absl::Now() < accept_until_; }
  // Starts the call. Messages may be offered before.
  void Start() {
    self_ = shared_from_this();
    // Offer and Close start writes from outside the reactions: the hold keeps the call from
    // ending under them (released once the call is over and none is starting).
    AddHold();
    StartRead(&reply_);
    StartCall();
    MaybeArm();
  }
  // Queues `m` after the messages before it; false, and `m` untouched, when the stream takes no
  // more.
  bool Offer(Message& m) {
    bool write = false;
    {
      absl::MutexLock lock(&mu_);
      if (over_ || closing_) return false;
      unsent_.push_back({std::move(m), 0});
      if (!writing_) {
        writing_ = write = true;
        ++starting_;
        PrepareWrite();
      }
    }
    if (write) {
      StartWrite(&out_);
      Started();
    }
    MaybeArm();
    return true;
  }
  // Takes no more messages; half-closes once those it has are answered.
  void Close() {
    bool half = false;
    {
      absl::MutexLock lock(&mu_);
      if (over_) return;
      closing_ = true;
      half = HalfCloseDue();
      if (half) ++starting_;
    }
    if (half) {
      StartWritesDone();
      Started();
    }
  }
  void Cancel() { ctx_.TryCancel(); }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the call broke: OnDone says how
    bool write = false, half = false;
    {
      absl::MutexLock lock(&mu_);
      if (!unsent_.empty()) {
        PrepareWrite();
        write = true;
      } else {
        writing_ = false;
        half = HalfCloseDue();
      }
    }
    if (write) StartWrite(&out_);
    if (half) StartWritesDone();
  }
  void OnReadDone(bool ok) override {
    if (!ok) {  // the call is over: OnDone says how, once no write is starting
      bool release = false;
      {
        absl::MutexLock lock(&mu_);
        over_ = true;
        release = starting_ == 0;
      }
      if (release) RemoveHold();
      return;
    }
    absl::Status verdict;
    const absl::Status parsed = ParseStreamReply(reply_, &verdict);
    reply_.Clear();
    std::optional<Message> m;
    bool half = false;
    {
      absl::MutexLock lock(&mu_);
      if (parsed.ok() && !sent_.empty()) {
        m = std::move(sent_.front());
        sent_.pop_front();
        half = HalfCloseDue();
      } else {
        broken_ =
            parsed.ok() ? absl::InternalError("the peer answered a message never sent") : parsed;
      }
    }
    if (!m) {
      Cancel();            // its messages go as pushes
      StartRead(&reply_);  // fails at once: its OnReadDone lets the call end
      return;
    }
    if (RetryLater(verdict, m->reach, m->deadline, kFirstBackoff)) {
      // A peer still starting up: tried again as a Push does, after a backoff.
      transport_->SendAsPush(to_, *std::move(m), kFirstBackoff);
    } else {
      m->done(std::move(verdict));
      transport_->Finished();
    }
    if (half) StartWritesDone();
    StartRead(&reply_);
  }
  void OnDone(const grpc::Status& s) override {
    std::vector<Message> left;
    absl::Status why = FromGrpcStatus(s);
    bool head_written = false;  // left's first was written, whole or in part
    grpc::Alarm* alarm = nullptr;
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      head_written = !sent_.empty() || (!unsent_.empty() && unsent_.front().next > 0);
      for (Message& m : sent_) left.push_back(std::move(m));
      for (Unsent& u : unsent_) left.push_back(std::move(u.m));
      sent_.clear();
      unsent_.clear();
      if (armed_) alarm = alarm_.get();
      if (!broken_.ok()) why = broken_;
      head_written = head_written && broken_.ok();
    }
    if (alarm != nullptr) alarm->Cancel();
    transport_->StreamEnded(to_, this, why);
    if (!left.empty()) {
      spdlog::debug("worker {}: the stream to worker {} ended ({}) with {} message(s) unanswered",
                    transport_->self_, to_, why.ToString(), left.size());
    }
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < left.size(); ++i) {
      Message& m = left[i];
      if (m.deadline <= now) {
        m.done(absl::DeadlineExceededError(
            absl::StrCat("no answer from worker ", to_, " before the message's deadline")));
      } else if (i == 0 && head_written && RefusesTheMessage(why)) {
        m.done(why);  // the peer ended the stream over this message's chunks: its verdict
      } else {
        transport_->SendAsPush(to_, std::move(m));  // a Push of its own brings its verdict
        continue;
      }
      transport_->Finished();
    }
    std::shared_ptr<PeerStream> me = std::move(self_);  // maybe the last hold: freed on return
  }

 private:
  struct Unsent {
    Message m;
    size_t next = 0;  // its next chunk to write
  };

  // The next chunk into out_; a message whose last chunk it is now waits for its answer.
  void PrepareWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Unsent& u = unsent_.front();
    out_ = RawChunkMessage((*u.m.chunks)[u.next], u.m.chunks, nullptr);
    if (++u.next == u.m.chunks->size()) {
      sent_.push_back(std::move(u.m));
      unsent_.pop_front();
    }
  }
  // The earliest deadline of the messages unanswered; InfiniteFuture with none.
  absl::Time EarliestDeadline() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Time when = absl::InfiniteFuture();
    for (const Message& m : sent_) when = std::min(when, m.deadline);
    for (const Unsent& u : unsent_) when = std::min(when, u.m.deadline);
    return when;
  }
  // A write started from outside the reactions is under way in gRPC: the call may end.
  void Started() {
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      release = --starting_ == 0 && over_;
    }
    if (release) RemoveHold();
  }
  // True, once, when the stream should half-close now: past its life (or closing) with nothing
  // left to write or to hear.
  bool HalfCloseDue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (half_closed_ || writing_ || !unsent_.empty() || !sent_.empty()) return false;
    if (!closing_ && absl::Now() < accept_until_) return false;
    closing_ = half_closed_ = true;
    return true;
  }
  // Arms the alarm for the earliest deadline of the messages unanswered or the end of the
  // stream's life, whichever comes first (the life once past: the deadlines alone), unless it is
  // armed for that or sooner already. Messages come with later deadlines as a rule, so the alarm
  // is set about once a round timeout or a life, not once a message.
  void MaybeArm() {
    std::unique_ptr<grpc::Alarm> replaced;
    grpc::Alarm* alarm = nullptr;
    absl::Time when = absl::InfiniteFuture();
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      if (ended_ || half_closed_) return;
      when = EarliestDeadline();
      if (when == absl::InfiniteFuture() || absl::Now() < accept_until_) {
        when = std::min(when, accept_until_);
      }
      if (armed_ && armed_for_ <= when) return;
      armed_ = true;
      armed_for_ = when;
      id = ++alarm_id_;
      replaced = std::move(alarm_);
      alarm_ = std::make_unique<grpc::Alarm>();
      alarm = alarm_.get();
    }
    replaced.reset();  // cancelled if still set: its callback finds its id stale
    alarm->Set(absl::ToChronoTime(when), [weak = weak_from_this(), id](bool ok) {
      if (std::shared_ptr<PeerStream> me = weak.lock()) me->OnAlarm(ok, id);
    });
    bool ended;
    {
      absl::MutexLock lock(&mu_);
      ended = ended_;
    }
    if (ended) alarm->Cancel();  // OnDone came before it was set
  }
  void OnAlarm(bool ok, uint64_t id) {
    bool expired = false, idle_over = false;
    {
      absl::MutexLock lock(&mu_);
      if (id != alarm_id_) return;  // one replaced by an earlier
      armed_ = false;
      if (!ok || ended_) return;
      const absl::Time now = absl::Now();
      expired = EarliestDeadline() <= now;
      idle_over = !expired && sent_.empty() && unsent_.empty() && !writing_ && now >= accept_until_;
    }
    if (expired) {
      Cancel();
    } else if (idle_over) {
      Close();
    } else {
      MaybeArm();
    }
  }

  GrpcTransport* const transport_;
  const int to_;
  const absl::Time accept_until_;
  const absl::Time call_deadline_;
  grpc::ClientContext ctx_;
  // Set by Start before the call starts, taken by OnDone after it ends.
  std::shared_ptr<PeerStream> self_;
  // The writer's: filled under mu_ by whoever starts a write, read by gRPC until OnWriteDone.
  grpc::ByteBuffer out_;
  grpc::ByteBuffer reply_;  // the reader's
  absl::Mutex mu_;
  std::deque<Unsent> unsent_ ABSL_GUARDED_BY(mu_);  // the front one may be partly written
  std::deque<Message> sent_ ABSL_GUARDED_BY(mu_);   // written, waiting for their answers
  bool writing_ ABSL_GUARDED_BY(mu_) = false;       // a write is in flight
  bool closing_ ABSL_GUARDED_BY(mu_) = false;       // takes no more messages
  bool half_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool over_ ABSL_GUARDED_BY(mu_) = false;   // the read failed: no write may start
  int starting_ ABSL_GUARDED_BY(mu_) = 0;    // writes starting outside the reactions
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // OnDone ran
  bool armed_ ABSL_GUARDED_BY(mu_) = false;  // alarm_ is set and has not fired
  absl::Time armed_for_ ABSL_GUARDED_BY(mu_);
  uint64_t alarm_id_ ABSL_GUARDED_BY(mu_) = 0;  // alarm_'s
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // a reply that made no sense
};

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
  if (RetryLater(status, reach_, deadline_, backoff_)) {
    auto* next = new Push(transport_, stubs_, chunks_, deadline_, reach_,
                          std::min(backoff_ * 2, kMaxBackoff), std::move(done_));
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
  Message m{std::move(chunks), deadline, reach, std::move(done)};
  std::shared_ptr<PeerStream> stream, fresh, closing;
  bool known = false;
  {
    absl::MutexLock lock(&mu_);
    if (to >= 0 && static_cast<size_t>(to) < peers_.size() && !peers_[to].raw.empty()) {
      known = true;
      ++in_flight_;
      const bool striped =
          bytes >= striping_.min_bytes && peers_[to].raw.size() > 1 && m.chunks->size() > 1;
      if (!striped && !m.chunks->empty() && reach != Reach::kWaitForReady) {
        stream = StreamFor(to, &fresh, &closing);
      }
    }
  }
  if (!known) {
    m.done(absl::UnavailableError(absl::StrCat("no address for worker ", to)));
    return;
  }
  if (fresh != nullptr) fresh->Start();
  if (closing != nullptr) closing->Close();
  if (stream != nullptr && stream->Offer(m)) return;
  SendAsPush(to, std::move(m));
}

std::shared_ptr<GrpcTransport::PeerStream> GrpcTransport::StreamFor(
    int to, std::shared_ptr<PeerStream>* fresh, std::shared_ptr<PeerStream>* closing) {
  Peer& p = peers_[to];
  if (!striping_.streams || draining_ || p.no_streams) return nullptr;
  std::shared_ptr<PeerStream> open = p.stream.lock();
  if (open != nullptr && open->Takes()) return open;
  *closing = std::move(open);  // released outside the lock: its deleter takes it
  *fresh = std::shared_ptr<PeerStream>(
      new PeerStream(this, to, p.raw[0].get(), striping_.stream_life), [this](PeerStream* s) {
        delete s;  // its call, and the channel reference it holds, before the transport may go
        StreamGone();
      });
  ++streams_;
  ++streams_opened_;
  p.stream = *fresh;
  std::erase_if(live_, [](const std::weak_ptr<PeerStream>& w) { return w.expired(); });
  live_.push_back(*fresh);
  return *fresh;
}

void GrpcTransport::SendAsPush(int to, Message m, absl::Duration after) {
  const uint64_t bytes = m.chunks->empty() ? 0 : m.chunks->front().total_size();
  std::vector<grpc::GenericStub*> stubs;
  {
    absl::MutexLock lock(&mu_);
    if (to >= 0 && static_cast<size_t>(to) < peers_.size() && !peers_[to].raw.empty()) {
      const size_t k = bytes >= striping_.min_bytes ? peers_[to].raw.size() : 1;
      for (size_t i = 0; i < std::min(k, std::max<size_t>(m.chunks->size(), 1)); ++i) {
        stubs.push_back(peers_[to].raw[i].get());
      }
    }
  }
  if (stubs.empty()) {
    m.done(absl::UnavailableError(absl::StrCat("no address for worker ", to)));
    Finished();
    return;
  }
  auto* push =
      new Push(this, std::move(stubs), std::move(m.chunks), m.deadline, m.reach,
               after > absl::ZeroDuration() ? std::min(after * 2, kMaxBackoff) : kFirstBackoff,
               std::move(m.done));
  if (after > absl::ZeroDuration()) {
    push->StartAfter(after);
  } else {
    push->Start();
  }
}

void GrpcTransport::StreamEnded(int to, const PeerStream* stream, const absl::Status& status) {
  std::shared_ptr<PeerStream> current;  // released outside the lock
  absl::MutexLock lock(&mu_);
  if (to < 0 || static_cast<size_t>(to) >= peers_.size()) return;
  Peer& p = peers_[to];
  current = p.stream.lock();
  if (current.get() != stream) return;  // replaced already, or on a peer's old address
  p.stream.reset();
  if (absl::IsUnimplemented(status) && !p.no_streams) {
    p.no_streams = true;
    spdlog::info(
        "worker {}: worker {} serves no Gossip.Stream (an older tern): a Push call "
        "for each message to it",
        self_, to);
  }
}

void GrpcTransport::StreamGone() {
  absl::MutexLock lock(&mu_);
  --streams_;
}

int GrpcTransport::streams_opened() const {
  absl::MutexLock lock(&mu_);
  return streams_opened_;
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
  std::vector<std::shared_ptr<PeerStream>> open;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &in_flight_));
    for (const std::weak_ptr<PeerStream>& w : live_) {
      if (std::shared_ptr<PeerStream> s = w.lock()) open.push_back(std::move(s));
    }
  }
  for (const std::shared_ptr<PeerStream>& s : open) s->Cancel();  // each has nothing in flight
  open.clear();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &streams_));
}

}  // namespace tern
