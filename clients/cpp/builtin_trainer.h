// The embedded default workload: a C++ trainer (softmax or MLP on Fashion-MNIST, or synthetic
// data when the dataset is absent) that drives a worker as any trainer does: Register the model,
// then each step hand over the gradient and take the parameters back. `tern worker` links it
// straight into its daemon (NewInProcessTrainerLink); over NewGrpcTrainerLink it speaks the
// Trainer service exactly as an external trainer would.
//
// Thread-safety: RunBuiltinTrainer blocks its calling thread; `stop` may be set from any thread.
#ifndef TERN_CLIENTS_CPP_BUILTIN_TRAINER_H_
#define TERN_CLIENTS_CPP_BUILTIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "clients/cpp/trainer_link.h"

namespace tern {

struct BuiltinTrainerOptions {
  std::string model = "mlp";
  std::string data_dir;  // "" = auto-detect, synthetic when absent
  std::string partition = "iid";
  int batch = 32;
  int epochs = 1;
  int worker_id = 0;
  int num_workers = 1;
  uint64_t seed = 1;      // same on every worker: data split and initial model
  int64_t max_steps = 0;  // stop after this many steps (0: after `epochs`)
  // Fault injection (`tern run --kill_worker`): SIGKILL this process once this many steps are
  // done, at that step's end exactly (0: never).
  int64_t crash_after_steps = 0;
  // Each step takes at least this long (the trainer sleeps after its compute), as a larger
  // model's would (`--min_step_ms`): a test's run in the proportion of compute to failure
  // detection that real runs have.
  absl::Duration min_step = absl::ZeroDuration();
};

// Steps every worker takes per epoch: ceil(train_size / (workers * batch)), so that together
// they see the training set once per epoch whatever the partition's sizes.
int64_t StepsPerEpoch(size_t train_size, int workers, int batch);

absl::Status RunBuiltinTrainer(TrainerLink& link, const BuiltinTrainerOptions& options,
                               const std::atomic<bool>& stop);

}  // namespace tern

#endif  // TERN_CLIENTS_CPP_BUILTIN_TRAINER_H_
