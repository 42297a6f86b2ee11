// A trainer on the worker's host steps through shared memory (docs/trainer-shm.md): Open makes a
// segment holding the gradient region the trainer writes and the parameter region it reads (the
// engine's parameters are bound there, so each step writes them in place), and a doorbell, a Unix
// socket beside it on which each step is one message ('S' and a StepInfo; a status byte and a
// StepResult back). Trainer.StepShared is the same step over gRPC. An adapter over TrainerPort.
//
// Thread-safety: thread-safe. Open and Step run as jobs of the worker's round loop (the port's
// lock held); the doorbell's thread takes the port's lock for each step; the segment's own state
// is under its own lock, always taken inside the port's. Close() before the port goes.
#ifndef TERN_WORKER_TRAINER_SEGMENT_H_
#define TERN_WORKER_TRAINER_SEGMENT_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/seqpacket_server.h"
#include "common/shared_memory.h"
#include "tern/v1/worker.pb.h"
#include "worker/engine.h"
#include "worker/trainer_port.h"

namespace tern {

class TrainerSegment {
 public:
  TrainerSegment(int worker_id, RoundEngine* engine, TrainerPort* port)
      : worker_id_(worker_id), engine_(engine), port_(port) {}
  ~TrainerSegment() { Close(); }
  TrainerSegment(const TrainerSegment&) = delete;
  TrainerSegment& operator=(const TrainerSegment&) = delete;

  // A fresh segment (a trainer that opens again gets a new one), the parameters moved into it,
  // and the doorbell started at the first. A job of the round loop: the port's lock is held.
  absl::StatusOr<v1::SharedMemoryInfo> Open() ABSL_LOCKS_EXCLUDED(mu_);
  // A step with the gradient as the trainer wrote it; the parameters are in the segment after
  // it. A job of the round loop: the port's lock is held.
  absl::StatusOr<v1::StepResult> Step(const v1::StepInfo& info) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the doorbell and moves the parameters back into the engine's memory before the
  // segment goes. Idempotent.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The doorbell's handler (its own thread).
  std::string Doorbell(absl::string_view request) ABSL_LOCKS_EXCLUDED(mu_);

  const int worker_id_;
  RoundEngine* const engine_;
  TrainerPort* const port_;
  absl::Mutex mu_;
  std::unique_ptr<SharedSegment> segment_ ABSL_GUARDED_BY(mu_);  // the trainer's, once asked
  // Where the trainer writes the gradient; the model follows it.
  size_t grad_at_ ABSL_GUARDED_BY(mu_) = 0;
  int serial_ ABSL_GUARDED_BY(mu_) = 0;
  // The trainer's doorbell, made at its first Open.
  std::unique_ptr<SeqpacketServer> doorbell_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tern

#endif  // TERN_WORKER_TRAINER_SEGMENT_H_
