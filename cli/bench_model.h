// `tern bench model`: one training step's compute (forward, loss, backward) of a built-in model on
// a batch, the number the race against PyTorch depends on (bench/model_step.py times torch on the
// same shapes in the same run and prints the ratio).
#ifndef TERN_CLI_BENCH_MODEL_H_
#define TERN_CLI_BENCH_MODEL_H_

#include <string>

#include "absl/status/status.h"

namespace tern {

struct BenchModelOptions {
  std::string model = "mlp:hidden=1024x1024";
  int batch = 64;
  double min_seconds = 1.0;
};

// Prints one JSON line: {"model", "batch", "threads", "params", "ms_per_step", "steps"}.
absl::Status RunBenchModel(const BenchModelOptions& options, int threads);

}  // namespace tern

#endif  // TERN_CLI_BENCH_MODEL_H_
