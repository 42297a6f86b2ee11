#include "worker/trainer_port.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/json_lines.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "tern/v1/records.pb.h"

namespace tern {
namespace {

// How long a registration of a worker that may be rejoining waits for its peers to be known.
constexpr absl::Duration kRegisterPeersWait = absl::Seconds(60);

}  // namespace

v1::StepResult StepResultOf(const StepOutcome& out) {
  v1::StepResult result;
  result.set_step(static_cast<uint64_t>(out.step));
  result.set_lr(out.lr);
  for (int j : out.mixed) result.add_mixed(static_cast<uint32_t>(j));
  for (int j : out.dropped) result.add_dropped(static_cast<uint32_t>(j));
  *result.mutable_step_stats() = out.delta;
  result.set_worker_seconds(out.seconds);
  return result;
}

absl::Status TrainerPort::OpenRoundLog(const std::string& path) {
  absl::MutexLock lock(&mu_);
  round_log_.open(path, std::ios::trunc);
  if (!round_log_) return absl::InvalidArgumentError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status TrainerPort::Usable() const {
  if (closed_) return absl::UnavailableError("worker is shutting down");
  return absl::OkStatus();
}

absl::Status TrainerPort::CanStep() const {
  TERN_RETURN_IF_ERROR(Usable());
  if (!engine_->initialized()) return absl::FailedPreconditionError("register the model first");
  if (options_.num_workers > 1 && !options_.peers_known()) {
    return absl::UnavailableError("this worker does not know its peers yet");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterReply> TrainerPort::Register(const std::vector<ParamTensor>& layout,
                                                        absl::Span<const float> x0) {
  absl::MutexLock lock(&mu_);
  return RegisterLocked(layout, x0);
}

absl::StatusOr<v1::RegisterReply> TrainerPort::RegisterLocked(
    const std::vector<ParamTensor>& layout, absl::Span<const float> x0) {
  TERN_RETURN_IF_ERROR(Usable());
  if (layout.empty() || x0.size() != LayoutNumel(layout)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", x0.size(), " parameters; its layout says ", LayoutNumel(layout)));
  }
  if (engine_->rejoins() && !engine_->initialized()) {
    // Init asks the peers where the group is: a trainer that registers before the worker knows
    // them (its peers file or the scheduler's rendezvous still to come) would start a worker
    // joining a running run from its own x0. Waited for here, as a step would be.
    const absl::Time until = absl::Now() + kRegisterPeersWait;
    while (!options_.peers_known()) {
      if (absl::Now() > until) {
        return absl::UnavailableError(absl::StrCat("this worker does not know its peers after ",
                                                   absl::FormatDuration(kRegisterPeersWait),
                                                   ": register again once it does"));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  TERN_RETURN_IF_ERROR(engine_->Init(layout, x0));
  v1::RegisterReply reply;
  reply.set_worker_id(static_cast<uint32_t>(options_.worker_id));
  reply.set_num_workers(static_cast<uint32_t>(options_.num_workers));
  reply.set_algorithm(options_.algorithm);
  reply.set_momentum(engine_->momentum());
  reply.set_sync_steps(static_cast<uint64_t>(engine_->sync_steps()));
  reply.set_step(static_cast<uint64_t>(engine_->next_step()));
  last_step_end_ = absl::Now();
  spdlog::info("worker {}: model registered ({} tensors, {} parameters)", options_.worker_id,
               layout.size(), x0.size());
  if (options_.registered) options_.registered(x0.size());
  return reply;
}

absl::Status TrainerPort::BindParams(absl::Span<float> storage) {
  absl::MutexLock lock(&mu_);
  TERN_RETURN_IF_ERROR(Usable());
  if (bound_by_segment_) {
    return absl::FailedPreconditionError("the parameters live in a shared-memory segment");
  }
  return BindParamsLocked(storage, /*by_segment=*/false);
}

absl::Status TrainerPort::BindParamsLocked(absl::Span<float> storage, bool by_segment) {
  if (!engine_->initialized()) return absl::FailedPreconditionError("register the model first");
  if (!storage.empty() && storage.size() != engine_->params().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "storage for ", storage.size(), " values; the model has ", engine_->params().size()));
  }
  TERN_RETURN_IF_ERROR(engine_->BindParams(storage));
  bound_by_segment_ = by_segment && !storage.empty();
  return absl::OkStatus();
}

absl::Status TrainerPort::BeginStep(const StepInput& in) {
  absl::MutexLock lock(&mu_);
  TERN_RETURN_IF_ERROR(CanStep());
  step_begun_ = false;
  TERN_RETURN_IF_ERROR(engine_->BeginStep(in));
  step_begun_ = true;
  return absl::OkStatus();
}

absl::Status TrainerPort::GradReady(uint64_t from) {
  absl::MutexLock lock(&mu_);
  if (!step_begun_) return absl::FailedPreconditionError("no step begun");
  absl::Status s = engine_->GradReadyFrom(from);
  if (!s.ok()) step_begun_ = false;
  return s;
}

absl::StatusOr<absl::Span<const float>> TrainerPort::Step(const StepInput& in,
                                                          StepOutcome* outcome) {
  // On the trainer's own thread: a hand-off to the round loop and back would cost two wake-ups
  // a step.
  absl::MutexLock lock(&mu_);
  if (engine_->initialized() && in.grad.size() != engine_->params().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the gradient has ", in.grad.size(), " values; the model has ", engine_->params().size()));
  }
  TERN_ASSIGN_OR_RETURN(StepOutcome out, StepLocked(in));
  if (outcome != nullptr) *outcome = std::move(out);
  return engine_->params();
}

absl::StatusOr<StepOutcome> TrainerPort::StepLocked(const StepInput& in) {
  TERN_RETURN_IF_ERROR(CanStep());
  const bool begun = std::exchange(step_begun_, false);
  TERN_ASSIGN_OR_RETURN(StepOutcome out, begun ? engine_->FinishStep(in) : engine_->Step(in));
  LogStep(out);
  return out;
}

void TrainerPort::RunExclusive(const std::function<void()>& f) {
  absl::MutexLock lock(&mu_);
  f();
}

void TrainerPort::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

void TrainerPort::LogStep(const StepOutcome& out) {
  const absl::Time start = last_step_end_;
  last_step_end_ = absl::Now();
  if (!round_log_.is_open()) return;
  const v1::WorkerStats& d = out.delta;
  v1::StepRecord r;
  r.set_step(static_cast<int32_t>(out.step));
  r.set_lr(out.lr);
  r.set_mixed(static_cast<int32_t>(out.mixed.size()));
  r.set_dropped(static_cast<int32_t>(out.dropped.size()));
  r.set_loss(d.loss_sum());
  r.set_payload_bytes_sent(static_cast<double>(d.payload_bytes_sent()));
  r.set_wire_bytes_sent(static_cast<double>(d.wire_bytes_sent()));
  r.set_payload_bytes_received(static_cast<double>(d.payload_bytes_received()));
  r.set_wire_bytes_received(static_cast<double>(d.wire_bytes_received()));
  r.set_dense_bytes_sent(static_cast<double>(d.dense_bytes_sent()));
  r.set_compute_s(d.compute_seconds());
  r.set_encode_s(d.encode_seconds());
  r.set_wait_s(d.wait_seconds());
  r.set_transfer_s(d.transfer_seconds());
  r.set_combine_s(d.combine_seconds());
  r.set_decode_s(d.decode_seconds());
  r.set_clipped(static_cast<int32_t>(d.contributions_clipped()));
  r.set_trainer_io_s(d.trainer_io_seconds());
  for (int id : out.mixed) r.add_mixed_ids(id);
  for (int id : out.dropped) r.add_dropped_ids(id);
  r.set_start_unix_s(absl::ToDoubleSeconds(start - absl::UnixEpoch()));
  r.set_end_unix_s(absl::ToDoubleSeconds(last_step_end_ - absl::UnixEpoch()));
  round_log_ << ToJsonLine(r);
  round_log_.flush();  // as it goes: a reader (or a crash) sees every finished step
}

}  // namespace tern
