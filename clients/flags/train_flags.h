// The training flags of `tern worker` and `tern run` (which passes them on to its workers), and
// their translation into the worker's options.
#ifndef TERN_CLIENTS_FLAGS_TRAIN_FLAGS_H_
#define TERN_CLIENTS_FLAGS_TRAIN_FLAGS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "clients/cpp/builtin_trainer.h"
#include "clients/flags/flag_types.h"
#include "core/workload/builtin_model.h"
#include "core/workload/dataset.h"
#include "worker/engine.h"

// The flags read outside their defining file, declared once here: every file defining them
// includes this one, so a declaration whose type (a number's range) drifts from the definition
// does not compile. Their groups (command_table.cc) are run_flags.cc (run_id, seed),
// task_flags.cc (batch, local_steps, outer, lr, norm_guard), data_flags.cc (model, data,
// partition), topology_flags.cc (topology, weights); the rest of train_flags.cc is `tern worker`'s
// and `tern run`'s alone.
ABSL_DECLARE_FLAG(std::string, run_id);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(std::string, partition);
ABSL_DECLARE_FLAG(std::string, topology);
ABSL_DECLARE_FLAG(std::string, weights);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, lr);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, norm_guard);
ABSL_DECLARE_FLAG(tern::Int<tern::In(1, 1048576)>, batch);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(1)>, local_steps);
ABSL_DECLARE_FLAG(std::string, outer);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(1)>, epochs);
ABSL_DECLARE_FLAG(tern::Double<tern::Above(0)>, round_timeout);
ABSL_DECLARE_FLAG(bool, overlap);
ABSL_DECLARE_FLAG(tern::Int<tern::In(1, 1024)>, overlap_steps);
ABSL_DECLARE_FLAG(tern::Double<tern::HalfOpen(0, 1)>, merge_alpha);
ABSL_DECLARE_FLAG(bool, keep_overlap);
ABSL_DECLARE_FLAG(std::string, outer_delay);
ABSL_DECLARE_FLAG(tern::Int<tern::In(0, 1 << 30)>, sync_steps);
ABSL_DECLARE_FLAG(std::string, codec_ladder);
ABSL_DECLARE_FLAG(tern::Double<tern::Open(0, 1)>, cu_target);
ABSL_DECLARE_FLAG(tern::Int<tern::In(0, 1 << 20)>, local_steps_max);
ABSL_DECLARE_FLAG(tern::Int<tern::In(1, 1 << 20)>, local_steps_min);
ABSL_DECLARE_FLAG(tern::Int<tern::In(0, 1024)>, fragments_min);
ABSL_DECLARE_FLAG(bool, rejoin);
ABSL_DECLARE_FLAG(tern::Double<tern::Above(0)>, rejoin_timeout);
ABSL_DECLARE_FLAG(tern::Int<tern::In(1, 64)>, state_sources);
ABSL_DECLARE_FLAG(tern::Double<tern::In(0, 1048576)>, bucket_mb);
ABSL_DECLARE_FLAG(tern::Int<tern::In(0, 1024)>, fragments);
ABSL_DECLARE_FLAG(std::string, fragment_cut);

namespace tern {

// Engine options from the flags, for worker `id` of `workers`, keeping a snapshot every
// `snapshot_every` steps.
absl::StatusOr<EngineOptions> EngineOptionsFromFlags(int id, int workers, int64_t snapshot_every,
                                                     int64_t total_steps);
BuiltinTrainerOptions TrainerOptionsFromFlags(int id, int workers);
// --lr, or its default for the algorithm when 0.
double EffectiveLr();
// --topology, or `complete` for --algorithm=diloco when --topology is at its default.
std::string EffectiveTopology();
std::string ModelFlag();
int BatchFlag();
int ComputeThreadsFlag();
// --compute_threads into the built-in model's BLAS (once, before any training).
void ApplyComputeThreads();
// --model, --partition and --data as the built-in trainer reads them, checked before anything
// binds or starts: a model spec that builds, a partition spec that parses, a data directory that
// exists.
absl::Status CheckDataFlags();
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

// The shared flags as "--name=value" arguments, to pass on to a child `tern worker`.
std::vector<std::string> SharedTrainFlagArgs();

}  // namespace tern

#endif  // TERN_CLIENTS_FLAGS_TRAIN_FLAGS_H_
