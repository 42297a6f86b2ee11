#include "cli/grpc_floor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/chunking.h"
#include "core/rpc/channel.h"

namespace tern {
namespace {

constexpr char kMethod[] = "/tern.bench.Floor/Push";

// Reads until the client half-closes, keeping each message's slices (no copy), then finishes.
class SinkReactor : public grpc::ServerGenericBidiReactor {
 public:
  SinkReactor() { StartRead(&in_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    kept_.emplace_back();
    kept_.back().Swap(&in_);
    StartRead(&in_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer in_;
  std::vector<grpc::ByteBuffer> kept_;
};

class SinkService : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new SinkReactor();
  }
};

// Writes [data, data + size) as messages of at most kMaxChunkBytes, each a slice over the
// caller's bytes (gRPC copies them into its frames, as it would a serialized chunk).
class SendReactor : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  SendReactor(const char* data, size_t size) : data_(data), size_(size) {}

  void Begin() {
    WriteNext();
    StartCall();
  }
  void OnWriteDone(bool ok) override {
    if (ok && sent_ < size_) WriteNext();
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  grpc::Status Wait() {
    done_.WaitForNotification();
    return status_;
  }

 private:
  void WriteNext() {
    const size_t n = std::min<size_t>(kMaxChunkBytes, size_ - sent_);
    grpc::Slice slice(data_ + sent_, n, grpc::Slice::STATIC_SLICE);
    out_ = grpc::ByteBuffer(&slice, 1);
    sent_ += n;
    if (sent_ >= size_) {
      StartWriteLast(&out_, grpc::WriteOptions());
    } else {
      StartWrite(&out_);
    }
  }

  const char* data_;
  size_t size_;
  size_t sent_ = 0;
  grpc::ByteBuffer out_;
  grpc::Status status_;
  absl::Notification done_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcFloor>> GrpcFloor::Start(int connections) {
  std::unique_ptr<GrpcFloor> f(new GrpcFloor());
  f->service_ = std::make_unique<SinkService>();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(f->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxChunkBytes + (64 << 10)));
  for (const auto& [name, value] : Http2Tuning()) builder.AddChannelArgument(name, value);
  f->server_ = builder.BuildAndStart();
  if (f->server_ == nullptr || port == 0) return absl::UnavailableError("floor: cannot listen");
  for (int i = 0; i < connections; ++i) {
    grpc::ChannelArguments args = TernChannelArguments();
    args.SetInt("tern.bench.connection", i);  // distinct arguments: a channel of its own
    f->stubs_.push_back(std::make_unique<grpc::GenericStub>(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args)));
  }
  return f;
}

GrpcFloor::~GrpcFloor() {
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
}

absl::StatusOr<double> GrpcFloor::Seconds(const char* data, size_t size) {
  const size_t n = stubs_.size();
  const size_t per = (size + n - 1) / n;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<SendReactor>> calls;
  const absl::Time t0 = absl::Now();
  for (size_t i = 0; i < n && i * per < size; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(absl::ToChronoTime(t0 + absl::Minutes(1)));
    calls.push_back(std::make_unique<SendReactor>(data + i * per, std::min(per, size - i * per)));
    stubs_[i]->PrepareBidiStreamingCall(contexts.back().get(), kMethod, grpc::StubOptions(),
                                        calls.back().get());
    calls.back()->Begin();
  }
  for (auto& call : calls) {
    const grpc::Status s = call->Wait();
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("floor push: ", s.error_message()));
  }
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

}  // namespace tern
