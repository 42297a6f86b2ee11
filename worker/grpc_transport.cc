#include "worker/grpc_transport.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/raw_chunk.h"
#include "core/rpc/status.h"
#include "grpcpp/alarm.h"

namespace tern {

namespace {

// Gossip.Push, called as a raw stream (a client-streaming method is a stream either way).
const std::string& PushMethod() {
  static const std::string* const kMethod =
      new std::string(absl::StrCat("/", v1::Gossip::service_full_name(), "/Push"));
  return *kMethod;
}

}  // namespace

// One push attempt; on UNAVAILABLE with retries allowed it schedules its successor after a
// backoff. Deletes itself in OnDone (gRPC's reactor ownership model).
class GrpcTransport::PushCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PushCall(GrpcTransport* transport, grpc::GenericStub* stub, Chunks chunks, absl::Time deadline,
           bool retry, absl::Duration backoff, std::function<void(absl::Status)> done)
      : transport_(transport),
        stub_(stub),
        chunks_(std::move(chunks)),
        deadline_(deadline),
        retry_(retry),
        backoff_(backoff),
        done_(std::move(done)) {}

  void Start() {
    ctx_.set_deadline(absl::ToChronoTime(deadline_));
    stub_->PrepareBidiStreamingCall(&ctx_, PushMethod(), grpc::StubOptions(), this);
    StartRead(&reply_);  // the PushReply, once the receiver has taken the whole bundle
    WriteNextOrDone();
    StartCall();
  }

  // Starts this call after `delay` (the alarm lives in the call, which outlives it).
  void StartAfter(absl::Duration delay) {
    alarm_.Set(absl::ToChronoTime(absl::Now() + delay), [this](bool) { Start(); });
  }

  void OnWriteDone(bool ok) override {
    if (ok) WriteNextOrDone();  // else the stream broke; OnDone brings the status
  }
  void OnReadDone(bool) override {}

  void OnDone(const grpc::Status& s) override {
    const absl::Time now = absl::Now();
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE && retry_ && now + backoff_ < deadline_) {
      auto* next = new PushCall(transport_, stub_, chunks_, deadline_, retry_,
                                std::min(backoff_ * 2, absl::Milliseconds(500)), std::move(done_));
      next->StartAfter(backoff_);
    } else {
      done_(FromGrpcStatus(s));
      transport_->Finished();
    }
    delete this;
  }

 private:
  // Each chunk's data goes out from the shared chunks themselves, which the message keeps alive.
  // The last chunk goes with the half-close (one frame and one callback fewer).
  void WriteNextOrDone() {
    if (next_ >= chunks_->size()) {
      if (chunks_->empty()) StartWritesDone();
      return;
    }
    out_ = RawChunkMessage((*chunks_)[next_++], chunks_);
    if (next_ == chunks_->size()) {
      StartWriteLast(&out_, grpc::WriteOptions());
    } else {
      StartWrite(&out_);
    }
  }

  GrpcTransport* const transport_;
  grpc::GenericStub* const stub_;
  const Chunks chunks_;
  const absl::Time deadline_;
  const bool retry_;
  const absl::Duration backoff_;
  std::function<void(absl::Status)> done_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer out_;
  grpc::ByteBuffer reply_;
  grpc::Alarm alarm_;
  size_t next_ = 0;
};

absl::Status GrpcTransport::SetPeers(const std::vector<std::string>& addresses) {
  if (self_ < 0 || static_cast<size_t>(self_) >= addresses.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker id ", self_, " is not in the list of ", addresses.size(), " peers"));
  }
  std::vector<Peer> peers(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (static_cast<int>(i) == self_) continue;
    if (addresses[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("peer ", i, " has no address"));
    }
    std::shared_ptr<grpc::Channel> channel =
        MakeChannel(addresses[i], ChannelKind::kPeer, credentials_);
    peers[i].stub = v1::Gossip::NewStub(channel);
    peers[i].raw = std::make_unique<grpc::GenericStub>(channel);
  }
  absl::MutexLock lock(&mu_);
  if (!peers_.empty()) return absl::FailedPreconditionError("peers are already set");
  peers_ = std::move(peers);
  return absl::OkStatus();
}

bool GrpcTransport::has_peers() const {
  absl::MutexLock lock(&mu_);
  return !peers_.empty();
}

void GrpcTransport::Send(int to, Chunks chunks, absl::Time deadline, bool retry_unavailable,
                         std::function<void(absl::Status)> done) {
  grpc::GenericStub* stub = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (to >= 0 && static_cast<size_t>(to) < peers_.size()) stub = peers_[to].raw.get();
    if (stub != nullptr) ++in_flight_;
  }
  if (stub == nullptr) {
    done(absl::FailedPreconditionError(absl::StrCat("no address for worker ", to)));
    return;
  }
  auto* call = new PushCall(this, stub, std::move(chunks), deadline, retry_unavailable,
                            absl::Milliseconds(20), std::move(done));
  call->Start();
}

absl::StatusOr<v1::TensorBundle> GrpcTransport::Swap(int to, Chunks chunks, absl::Time deadline) {
  v1::Gossip::Stub* stub = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (to >= 0 && static_cast<size_t>(to) < peers_.size()) stub = peers_[to].stub.get();
  }
  if (stub == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("no address for worker ", to));
  }
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
