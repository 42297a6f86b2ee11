// ChunkedRequestReader alone, on a fake reactor base that records what the reader asks of gRPC:
// a whole bundle comes out once, a first message's header is checked before its chunk is held, a
// cut stream, a bad chunk and a budget overrun end the call with why, and held bytes go back.
#include "core/rpc/chunked_request.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tern/v1/worker.pb.h"

namespace tern {
namespace {

using ::testing::HasSubstr;

// What a grpc::ServerReadReactor gives the reader: StartRead and Finish.
template <typename Request>
class FakeReactor {
 public:
  virtual ~FakeReactor() = default;
  void StartRead(Request* r) {
    reading = r;
    ++reads;
  }
  void Finish(grpc::Status s) { finished = std::move(s); }
  virtual void OnReadDone(bool ok) = 0;

  Request* reading = nullptr;
  int reads = 0;
  std::optional<grpc::Status> finished;
};

class StepReader final
    : public ChunkedRequestReader<FakeReactor<v1::StepRequest>, v1::StepRequest> {
 public:
  explicit StepReader(StreamLimits::Stream* stream, uint64_t max_bytes = 1 << 20)
      : ChunkedRequestReader(max_bytes, "gradient") {
    StartReading(stream);
  }
  absl::Status OnFirst(const v1::StepRequest& first) override {
    if (!first.has_info()) return absl::InvalidArgumentError("no StepInfo");
    return absl::OkStatus();
  }
  void OnBundle(v1::TensorBundle b) override { bundles.push_back(std::move(b)); }
  // Sends `r` as the next request read.
  void Receive(const v1::StepRequest& r, bool ok = true) {
    *reading = r;
    // As gRPC calls it: through the reactor's interface (the reader's own is private).
    static_cast<FakeReactor<v1::StepRequest>*>(this)->OnReadDone(ok);
  }
  uint64_t read_bytes() const { return wire_bytes(); }

  std::vector<v1::TensorBundle> bundles;
};

std::vector<v1::StepRequest> Requests(bool with_info = true) {
  v1::TensorBundle b;
  b.set_run_id("r");
  b.add_tensors()->set_name(std::string(5000, 'x'));
  std::vector<v1::StepRequest> out;
  std::vector<v1::BundleChunk> chunks = ChunkBundle(b, 7, /*max_chunk_bytes=*/1000).value();
  for (v1::BundleChunk& c : chunks) {
    v1::StepRequest r;
    if (out.empty() && with_info) r.mutable_info()->set_step(3);
    *r.mutable_chunk() = std::move(c);
    out.push_back(std::move(r));
  }
  return out;
}

StreamLimitOptions Budget(uint64_t bytes) {
  StreamLimitOptions o;
  o.max_buffered_bytes = bytes;
  o.sweep_every = absl::ZeroDuration();
  return o;
}

TEST(ChunkedRequestReader, ReadsUntilTheBundleIsWholeThenHandsItOnAndGivesTheBytesBack) {
  StreamLimits limits(Budget(1 << 20));
  std::unique_ptr<StreamLimits::Stream> stream = *limits.Open("ipv4:10.0.0.1:1", {});
  StepReader r(stream.get());
  const std::vector<v1::StepRequest> requests = Requests();
  ASSERT_GT(requests.size(), 2u);
  uint64_t sent = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(r.bundles.empty());
    if (i > 0) {
      EXPECT_GT(limits.buffered_bytes(), 0u);  // held until the bundle is whole
    }
    r.Receive(requests[i]);
    sent += requests[i].ByteSizeLong() + 5;
  }
  ASSERT_EQ(r.bundles.size(), 1u);
  EXPECT_EQ(r.bundles[0].tensors(0).name().size(), 5000u);
  EXPECT_EQ(r.reads, static_cast<int>(requests.size()));  // no read after the last chunk
  EXPECT_FALSE(r.finished.has_value());                   // the subclass finishes
  EXPECT_EQ(r.read_bytes(), sent);
  EXPECT_EQ(limits.buffered_bytes(), 0u);
}

TEST(ChunkedRequestReader, ACutStreamABadChunkAMissingHeaderAndAnOverrunEndTheCallWithWhy) {
  {
    StepReader r(nullptr);
    r.Receive(Requests()[0]);
    r.Receive(v1::StepRequest(), /*ok=*/false);
    ASSERT_TRUE(r.finished.has_value());
    EXPECT_EQ(r.finished->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(r.finished->error_message(),
                HasSubstr("stream ended before the gradient's last chunk"));
  }
  {
    StepReader r(nullptr);
    std::vector<v1::StepRequest> requests = Requests();
    requests[1].mutable_chunk()->mutable_data()->front() ^= 1;  // its CRC no longer matches
    r.Receive(requests[0]);
    r.Receive(requests[1]);
    ASSERT_TRUE(r.finished.has_value());
    EXPECT_EQ(r.finished->error_code(), grpc::StatusCode::DATA_LOSS);
    EXPECT_TRUE(r.bundles.empty());
  }
  {
    StreamLimits limits(Budget(1 << 20));
    std::unique_ptr<StreamLimits::Stream> stream = *limits.Open("ipv4:10.0.0.1:1", {});
    StepReader r(stream.get());
    r.Receive(Requests(/*with_info=*/false)[0]);
    ASSERT_TRUE(r.finished.has_value());
    EXPECT_THAT(r.finished->error_message(), HasSubstr("no StepInfo"));
    EXPECT_EQ(limits.buffered_bytes(), 0u);  // refused before any of it was held
  }
  {
    StreamLimits limits(Budget(1500));
    std::unique_ptr<StreamLimits::Stream> stream = *limits.Open("ipv4:10.0.0.1:1", {});
    StepReader r(stream.get());
    for (const v1::StepRequest& q : Requests()) {
      if (r.finished.has_value()) break;
      r.Receive(q);
    }
    ASSERT_TRUE(r.finished.has_value());
    EXPECT_EQ(r.finished->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_TRUE(r.bundles.empty());
  }
}

}  // namespace
}  // namespace tern
