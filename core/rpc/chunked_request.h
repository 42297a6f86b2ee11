// The reading half that every server reactor taking a chunked bundle shares: read a request,
// check the first one's header, feed its chunk (its bytes held against the call's share of the
// daemon's buffering budget), and read again until the bundle is whole; a stream that ends early
// or a bad chunk ends the call with why. The worker's Trainer.Register, Trainer.Step and
// Gossip.Swap and the server's InitModel and Push read this way. (Gossip.Push reads raw chunks,
// in place and in stripes: worker/gossip_service.cc.)
//
//   class RegisterCall final
//       : public ChunkedRequestReader<grpc::ServerReadReactor<v1::RegisterRequest>,
//                                     v1::RegisterRequest> {
//     RegisterCall(...) : ChunkedRequestReader(max_bytes, "model") { StartReading(); }
//     void OnBundle(v1::TensorBundle b) override { ... Finish(...); }
//   };
//
// Thread-safety: a gRPC reactor's: gRPC calls OnReadDone once at a time.
#ifndef TERN_CORE_RPC_CHUNKED_REQUEST_H_
#define TERN_CORE_RPC_CHUNKED_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/chunking.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/status.h"
#include "core/rpc/stream_limits.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// Base: grpc::ServerReadReactor<Request> or grpc::ServerBidiReactor<Request, Reply>. Request: a
// message with a `chunk` field, or v1::BundleChunk itself.
template <typename Base, typename Request>
class ChunkedRequestReader : public Base {
 protected:
  // `what` names the bundle in errors: "stream ended before the model's last chunk".
  ChunkedRequestReader(uint64_t max_bundle_bytes, const char* what)
      : assembler_(max_bundle_bytes), what_(what) {}

  // Starts reading. `stream` (may be null): the call's share of the daemon's buffering budget,
  // which each chunk's bytes count against until the bundle is whole, or, with
  // `release_when_whole` false, until the subclass releases them (it holds the bundle on).
  void StartReading(StreamLimits::Stream* stream = nullptr, bool release_when_whole = true) {
    stream_ = stream;
    release_when_whole_ = release_when_whole;
    this->StartRead(&req_);
  }
  // The first request, before its chunk is fed: a header to check (who calls, for what); an
  // error ends the call.
  virtual absl::Status OnFirst(const Request& first) { return absl::OkStatus(); }
  // The whole bundle. The subclass finishes the call (now or later).
  virtual void OnBundle(v1::TensorBundle bundle) = 0;
  // Ends the call with `why` (the default: as its gRPC status).
  virtual void Fail(const absl::Status& why) { this->Finish(ToGrpcStatus(why)); }
  // The request messages read so far, with gRPC's 5-byte message prefix each.
  uint64_t wire_bytes() const { return wire_bytes_; }

 private:
  void OnReadDone(bool ok) final {
    if (!ok) {
      Fail(absl::InvalidArgumentError(
          absl::StrCat("stream ended before the ", what_, "'s last chunk")));
      return;
    }
    wire_bytes_ += req_.ByteSizeLong() + 5;
    if (first_) {
      first_ = false;
      if (absl::Status s = OnFirst(req_); !s.ok()) {
        Fail(s);
        return;
      }
    }
    v1::BundleChunk& chunk = *ChunkOf(&req_);
    std::optional<absl::StatusOr<v1::TensorBundle>> got =
        stream_ != nullptr
            ? FeedCounted(*stream_, assembler_, std::move(chunk), release_when_whole_)
            : Feed(assembler_, std::move(chunk));
    // The assembler has the bytes: free the request's copy now, not at the next read, or a
    // stream stalled after this chunk holds them twice (twice its budget's worth, measured).
    std::string().swap(*chunk.mutable_data());
    if (!got) {
      this->StartRead(&req_);
      return;
    }
    if (!got->ok()) {
      Fail(got->status());
      return;
    }
    OnBundle(**std::move(got));
  }

  static v1::BundleChunk* ChunkOf(v1::BundleChunk* chunk) { return chunk; }
  template <typename R>
  static v1::BundleChunk* ChunkOf(R* request) {
    return request->mutable_chunk();
  }

  BundleAssembler assembler_;
  const char* const what_;
  StreamLimits::Stream* stream_ = nullptr;
  bool release_when_whole_ = true;
  Request req_;
  bool first_ = true;
  uint64_t wire_bytes_ = 0;
};

}  // namespace tern

#endif  // TERN_CORE_RPC_CHUNKED_REQUEST_H_
