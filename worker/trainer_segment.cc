#include "worker/trainer_segment.h"

#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace tern {
namespace {

// The segment's header (docs/trainer-shm.md): magic, then little-endian u64s.
constexpr char kShmMagic[8] = {'T', 'E', 'R', 'N', 'S', 'H', 'M', '1'};
constexpr size_t kShmHeader = 64;
constexpr size_t kShmAlign = 64;

size_t AlignUp(size_t n) { return (n + kShmAlign - 1) / kShmAlign * kShmAlign; }

}  // namespace

absl::StatusOr<v1::SharedMemoryInfo> TrainerSegment::Open() {
  port_->AssertHeld();  // a job of the round loop
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("worker is shutting down");
  if (!engine_->initialized()) return absl::FailedPreconditionError("register the model first");
  const size_t n = engine_->params().size();
  const size_t grad_at = kShmHeader, params_at = grad_at + AlignUp(n * sizeof(float));
  TERN_ASSIGN_OR_RETURN(
      std::unique_ptr<SharedSegment> segment,
      SharedSegment::Create(absl::StrCat("/tern-w", worker_id_, "-", getpid(), "-", ++serial_),
                            params_at + AlignUp(n * sizeof(float))));
  uint8_t* base = segment->data();
  std::memcpy(base, kShmMagic, sizeof(kShmMagic));
  const uint64_t header[3] = {n, grad_at, params_at};
  std::memcpy(base + 8, header, sizeof(header));
  grad_at_ = grad_at;
  // The parameters now live in the segment: the trainer reads them in place after every step.
  // (The old segment, if any, is released only after this copies out of it.)
  std::unique_ptr<SharedSegment> old = std::move(segment_);
  segment_ = std::move(segment);
  TERN_RETURN_IF_ERROR(port_->BindParamsLocked(
      absl::MakeSpan(reinterpret_cast<float*>(base + params_at), n), /*by_segment=*/true));
  old.reset();
  v1::SharedMemoryInfo info;
  info.set_path(segment_->path());
  info.set_size(segment_->size());
  info.set_num_params(n);
  info.set_grad_offset(grad_at);
  info.set_params_offset(params_at);
  if (doorbell_ == nullptr) {
    absl::StatusOr<std::unique_ptr<SeqpacketServer>> bell =
        SeqpacketServer::Start(absl::StrCat("/dev/shm/tern-w", worker_id_, "-", getpid(), ".sock"),
                               [this](absl::string_view request) { return Doorbell(request); });
    if (bell.ok()) {
      doorbell_ = *std::move(bell);
    } else {  // Trainer.StepShared still works
      spdlog::warn("worker {}: no doorbell socket: {}", worker_id_, bell.status().ToString());
    }
  }
  if (doorbell_ != nullptr) info.set_doorbell_path(doorbell_->path());
  spdlog::info("worker {}: trainer steps through shared memory {}", worker_id_, segment_->path());
  return info;
}

absl::StatusOr<v1::StepResult> TrainerSegment::Step(const v1::StepInfo& info) {
  port_->AssertHeld();  // a job of the round loop, or the doorbell's RunExclusive
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("worker is shutting down");
  if (segment_ == nullptr) return absl::FailedPreconditionError("call OpenSharedMemory first");
  const size_t n = engine_->params().size();
  // The offsets are ours, never read back from the shared bytes (the trainer writes there).
  StepInput in = StepInputOf(info);
  in.grad = absl::MakeConstSpan(reinterpret_cast<const float*>(segment_->data() + grad_at_), n);
  TERN_ASSIGN_OR_RETURN(StepOutcome out, port_->StepLocked(in));
  // The parameters are already in the segment (bound there by Open).
  return StepResultOf(out);
}

std::string TrainerSegment::Doorbell(absl::string_view request) {
  absl::StatusOr<v1::StepResult> r = absl::InvalidArgumentError("not 'S' and a StepInfo message");
  v1::StepInfo info;
  // 'S' first: a StepInfo of defaults serializes to nothing, and a message may not be empty.
  if (!request.empty() && request[0] == 'S' &&
      info.ParseFromArray(request.data() + 1, static_cast<int>(request.size() - 1))) {
    port_->RunExclusive([&] { r = Step(info); });
  }
  // u8 status code (absl's numbering, gRPC's too) | the StepResult, or the error's message.
  std::string reply(1, static_cast<char>(r.status().code()));
  if (r.ok()) {
    reply += r->SerializeAsString();
  } else {
    reply += std::string(r.status().message().substr(0, 4096));
  }
  return reply;
}

void TrainerSegment::Close() {
  std::unique_ptr<SeqpacketServer> doorbell;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    doorbell = std::move(doorbell_);
  }
  // Stopped outside every lock: its thread may be waiting for the port's.
  if (doorbell != nullptr) doorbell->Stop();
  // The model back into the engine's memory before the segment goes.
  port_->RunExclusive([this] {
    port_->AssertHeld();
    absl::MutexLock lock(&mu_);
    if (segment_ != nullptr && engine_->initialized()) {
      (void)port_->BindParamsLocked({}, /*by_segment=*/false);
    }
    segment_.reset();
  });
}

}  // namespace tern
