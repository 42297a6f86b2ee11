// Flags shared by `tern worker` and `tern run` (which passes them on to its workers), and their
// translation into the worker's options.
#ifndef TERN_CLI_TRAIN_FLAGS_H_
#define TERN_CLI_TRAIN_FLAGS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "cli/flag_types.h"
#include "clients/cpp/builtin_trainer.h"
#include "core/workload/builtin_model.h"
#include "core/workload/dataset.h"
#include "worker/engine.h"

// The numbers other commands read too, declared once here: train_flags.cc includes this file, so
// a declaration whose type (its range) drifts from the definition does not compile.
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, lr);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, norm_guard);
ABSL_DECLARE_FLAG(tern::Int<tern::In(1, 1048576)>, batch);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(1)>, local_steps);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(1)>, epochs);
ABSL_DECLARE_FLAG(tern::Double<tern::Above(0)>, round_timeout);

namespace tern {

// Engine options from the flags, for worker `id` of `workers`, keeping a snapshot every
// `snapshot_every` steps.
absl::StatusOr<EngineOptions> EngineOptionsFromFlags(int id, int workers, int64_t snapshot_every,
                                                     int64_t total_steps);
BuiltinTrainerOptions TrainerOptionsFromFlags(int id, int workers);
// --lr, or its default for the algorithm when 0.
double EffectiveLr();
std::string ModelFlag();
int BatchFlag();
int ComputeThreadsFlag();
// --compute_threads into the built-in model's BLAS (once, before any training).
void ApplyComputeThreads();
// `steps` capped by --max_steps.
int64_t CapSteps(int64_t steps);

// What a launcher (`tern run`) evaluates with: --data's splits and a --model for them.
struct EvalSetup {
  TrainTest data;
  std::unique_ptr<Model> model;
};
// Loads them; on failure prints "tern run: <why>" and returns the exit code (1: the data,
// 2: the model spec).
int LoadEvalSetup(EvalSetup* out);

// The run folder: --out, or runs/<name>-<time>; created if needed. "" (after printing why) when
// it cannot be.
std::string MakeRunDir(const std::string& name);

// The shared flags as "--name=value" arguments, to pass on to a child `tern worker`.
std::vector<std::string> SharedTrainFlagArgs();

}  // namespace tern

#endif  // TERN_CLI_TRAIN_FLAGS_H_
