#include "clients/cpp/trainer_link.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/chunking.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/status.h"
#include "kernels/builtin.h"
#include "tern/v1/worker.grpc.pb.h"

namespace tern {
namespace {

// The protocol an external trainer speaks: every tensor chunked, CRC-checked and copied.
class GrpcTrainerLink final : public TrainerLink {
 public:
  GrpcTrainerLink(std::shared_ptr<grpc::Channel> channel, absl::Duration timeout)
      : stub_(v1::Trainer::NewStub(channel)),
        timeout_(timeout),
        codecs_(NewBuiltinCodecRegistry()) {}

  absl::StatusOr<int64_t> Register(const std::vector<ParamTensor>& layout,
                                   absl::Span<const float> x0) override {
    layout_ = layout;
    params_.assign(x0.begin(), x0.end());
    TERN_ASSIGN_OR_RETURN(v1::TensorBundle b, FlatToBundle(layout_, params_));
    TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks, ChunkBundle(b, 0));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    v1::RegisterReply reply;
    auto writer = stub_->Register(&ctx, &reply);
    for (auto& c : chunks) {
      v1::RegisterRequest req;
      *req.mutable_chunk() = std::move(c);
      if (!writer->Write(req)) break;
    }
    writer->WritesDone();
    TERN_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
    return static_cast<int64_t>(reply.step());
  }

  // UNAVAILABLE (a worker still waiting for its peers, or not up yet) changes nothing on the
  // worker: tried again until the timeout.
  absl::StatusOr<absl::Span<const float>> Step(const TrainerStep& s) override {
    const absl::Time t0 = absl::Now();
    const absl::Time deadline = t0 + timeout_;
    TERN_ASSIGN_OR_RETURN(v1::TensorBundle gb, FlatToBundle(layout_, s.grad));
    gb.set_round(static_cast<uint64_t>(s.step));
    double worker_seconds = 0;
    absl::Status st = TryStep(s, gb, deadline, &worker_seconds);
    while (absl::IsUnavailable(st) && absl::Now() + absl::Milliseconds(50) < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
      st = TryStep(s, gb, deadline, &worker_seconds);
    }
    TERN_RETURN_IF_ERROR(st);
    io_seconds_ = absl::ToDoubleSeconds(absl::Now() - t0) - worker_seconds;
    return absl::Span<const float>(params_);
  }

 private:
  absl::Status TryStep(const TrainerStep& s, const v1::TensorBundle& gb, absl::Time deadline,
                       double* worker_seconds) {
    TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks,
                          ChunkBundle(gb, static_cast<uint64_t>(s.step)));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    auto stream = stub_->Step(&ctx);
    for (size_t c = 0; c < chunks.size(); ++c) {
      v1::StepRequest req;
      if (c == 0) {
        v1::StepInfo* info = req.mutable_info();
        info->set_step(static_cast<uint64_t>(s.step));
        info->set_loss(s.loss);
        info->set_compute_seconds(s.compute_seconds);
        info->set_io_seconds(io_seconds_);
      }
      *req.mutable_chunk() = std::move(chunks[c]);
      if (!stream->Write(req)) break;
    }
    stream->WritesDone();
    v1::StepReply first;
    absl::StatusOr<v1::TensorBundle> pb = ReadChunkedBundle(stream.get(), &first);
    TERN_RETURN_IF_ERROR(FromGrpcStatus(stream->Finish()));
    TERN_RETURN_IF_ERROR(pb.status());
    TERN_RETURN_IF_ERROR(BundleToFlat(*pb, layout_, *codecs_, absl::MakeSpan(params_)));
    *worker_seconds = first.result().worker_seconds();
    return absl::OkStatus();
  }

  const std::unique_ptr<v1::Trainer::Stub> stub_;
  const absl::Duration timeout_;
  const std::unique_ptr<CodecRegistry> codecs_;
  std::vector<ParamTensor> layout_;
  std::vector<float> params_;
  double io_seconds_ = 0;  // the last call's, reported with the next
};

}  // namespace

std::unique_ptr<TrainerLink> NewGrpcTrainerLink(std::shared_ptr<grpc::Channel> channel,
                                                absl::Duration timeout) {
  return std::make_unique<GrpcTrainerLink>(std::move(channel), timeout);
}

}  // namespace tern
