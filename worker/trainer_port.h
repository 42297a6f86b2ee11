// The one door a trainer's step enters a worker by: register the model, bind its parameters to
// the trainer's storage, and run steps, whole (Step) or in parts as the backward pass finishes
// each bucket (BeginStep, GradReady as grad[from, end) is final, then Step to finish). A trainer
// in the worker's process calls it directly (the built-in trainer through its TrainerLink, the
// embedded PyTorch worker); the others reach it through adapters, each a room of its own: the
// gRPC Trainer service (worker/trainer_service.h) and the shared-memory segment with its doorbell
// (worker/trainer_segment.h).
//
//   TrainerPort& port = daemon->trainer();
//   port.Register(layout, x0);                      // once
//   port.Step(in, &outcome);                        // each step: the parameters after it
//
// Thread-safety: thread-safe. Every call runs in turn with the others under the port's lock, on
// the caller's thread; the worker's round loop runs its jobs under the same lock (RunExclusive),
// so an adapter's job calls the *Locked forms. A step blocks up to the round deadline while its
// neighbours' messages come; Close() makes every later call Unavailable.
#ifndef TERN_WORKER_TRAINER_PORT_H_
#define TERN_WORKER_TRAINER_PORT_H_

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/model/layout.h"
#include "tern/v1/worker.pb.h"
#include "worker/engine.h"

namespace tern {

// What a step's outcome answers a trainer (Trainer.Step, StepShared, the doorbell).
v1::StepResult StepResultOf(const StepOutcome& out);

struct TrainerPortOptions {
  int worker_id = 0;
  int num_workers = 1;
  std::string algorithm;  // what Register answers
  // Whether the worker knows its peers (a step before that is Unavailable; no peers are needed
  // with one worker).
  std::function<bool()> peers_known;
  // Called (under the port's lock) once a model of `num_params` values is registered.
  std::function<void(uint64_t num_params)> registered;
};

class TrainerPort {
 public:
  TrainerPort(TrainerPortOptions options, RoundEngine* engine)
      : options_(std::move(options)), engine_(engine) {}
  TrainerPort(const TrainerPort&) = delete;
  TrainerPort& operator=(const TrainerPort&) = delete;

  // When set, one JSON line per step: its bytes (payload, wire, dense) and time split.
  absl::Status OpenRoundLog(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);

  // Declares the model (its layout and initial values); the reply says the step to run next.
  absl::StatusOr<v1::RegisterReply> Register(const std::vector<ParamTensor>& layout,
                                             absl::Span<const float> x0) ABSL_LOCKS_EXCLUDED(mu_);
  // Moves the parameters into `storage` (as many floats as the model; the caller's, outliving
  // the binding) or back into the engine's memory with an empty span: every later step writes
  // them there, so the trainer reads them in place. Not while a shared segment holds them.
  absl::Status BindParams(absl::Span<float> storage) ABSL_LOCKS_EXCLUDED(mu_);
  // A step in parts: BeginStep before the backward pass (`in.step`, `in.grad`: the buffer it
  // writes), GradReady(from) as it finishes grad[from, end) (the buckets inside start their
  // rounds), then Step finishes it.
  absl::Status BeginStep(const StepInput& in) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status GradReady(uint64_t from) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs a step with `in.grad` (read in place), or finishes the one begun, and returns a view of
  // the parameters after it, valid and unchanged until the next step; `outcome` (may be null)
  // gets what the step did.
  absl::StatusOr<absl::Span<const float>> Step(const StepInput& in, StepOutcome* outcome)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `f` under the port's lock, in turn with every call.
  void RunExclusive(const std::function<void()>& f) ABSL_LOCKS_EXCLUDED(mu_);
  // For a function RunExclusive runs (the round loop's jobs), which the compiler cannot follow.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(mu_) { mu_.AssertHeld(); }
  // The same calls for a caller that holds the lock.
  absl::StatusOr<v1::RegisterReply> RegisterLocked(const std::vector<ParamTensor>& layout,
                                                   absl::Span<const float> x0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<StepOutcome> StepLocked(const StepInput& in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `by_segment`: the storage is a shared segment's (BindParams refuses while it holds them).
  absl::Status BindParamsLocked(absl::Span<float> storage, bool by_segment)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Every later call is Unavailable ("worker is shutting down"); waits for a call in progress.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status Usable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Usable, a model registered, and the peers known (with any): what a step needs.
  absl::Status CanStep() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogStep(const StepOutcome& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TrainerPortOptions options_;
  RoundEngine* const engine_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool step_begun_ ABSL_GUARDED_BY(mu_) = false;        // BeginStep opened the engine's step
  bool bound_by_segment_ ABSL_GUARDED_BY(mu_) = false;  // the parameters live in a segment
  std::ofstream round_log_ ABSL_GUARDED_BY(mu_);
  absl::Time last_step_end_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace tern

#endif  // TERN_WORKER_TRAINER_PORT_H_
