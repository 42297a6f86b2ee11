#include "clients/cpp/builtin_trainer.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "core/workload/builtin_model.h"
#include "core/workload/dataset.h"
#include "core/workload/partition.h"
#include "spdlog/spdlog.h"

namespace tern {

int64_t StepsPerEpoch(size_t train_size, int workers, int batch) {
  const size_t per_step = static_cast<size_t>(std::max(1, workers)) * std::max(1, batch);
  return static_cast<int64_t>((train_size + per_step - 1) / per_step);
}

absl::Status RunBuiltinTrainer(TrainerLink& link, const BuiltinTrainerOptions& o,
                               const std::atomic<bool>& stop) {
  if (o.batch < 1 || o.epochs < 0) return absl::InvalidArgumentError("batch >= 1, epochs >= 0");
  TERN_ASSIGN_OR_RETURN(PartitionSpec pspec, ParsePartition(o.partition));
  Dataset shard;
  size_t train_size;
  {
    // The full training set is only held while this worker's shard is cut from it.
    TERN_ASSIGN_OR_RETURN(TrainTest data, LoadTrainingData(o.data_dir, o.seed));
    if (data.synthetic) {
      spdlog::warn("worker {}: Fashion-MNIST not found; training on synthetic data", o.worker_id);
    }
    train_size = data.train.size();
    TERN_ASSIGN_OR_RETURN(auto parts, Partition(data.train.labels, data.train.num_classes,
                                                o.num_workers, pspec, o.seed));
    const std::vector<uint32_t>& mine = parts[o.worker_id];
    if (mine.empty()) return absl::FailedPreconditionError("this worker's partition is empty");
    shard.dim = data.train.dim;
    shard.num_classes = data.train.num_classes;
    shard.source = data.train.source;
    shard.features.resize(mine.size() * shard.dim);
    shard.labels.resize(mine.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      std::copy_n(data.train.row(mine[i]), shard.dim, shard.features.data() + i * shard.dim);
      shard.labels[i] = data.train.labels[mine[i]];
    }
  }
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                        CreateModel(o.model, shard.dim, shard.num_classes));
  std::vector<float> x0(model->NumParams()), grad(model->NumParams());
  model->Init(o.seed, absl::MakeSpan(x0));
  TERN_ASSIGN_OR_RETURN(const int64_t at, link.Register(model->Layout(), x0));
  if (at != 0) {
    // The worker rejoined a running run (diloco): training goes on from the group's model.
    absl::StatusOr<std::vector<float>> joined = link.Params();
    if (!joined.ok() || joined->size() != x0.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker is at step ", at, " and its parameters cannot be read through this link (",
          joined.status().ToString(), "); the built-in trainer then only starts fresh runs"));
    }
    x0 = *std::move(joined);
    spdlog::info("worker {}: going on from step {} with the worker's model", o.worker_id, at);
  }
  absl::Span<const float> params(x0);  // then the worker's, as each step returns them

  int64_t steps = o.epochs * StepsPerEpoch(train_size, o.num_workers, o.batch);
  if (o.max_steps > 0) steps = std::min(steps, o.max_steps);
  spdlog::info("worker {}: training {} on {} examples ({}), {} steps of batch {}", o.worker_id,
               model->Spec(), shard.size(), shard.source, steps, o.batch);
  std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(o.worker_id));
  std::vector<uint32_t> order(shard.size());
  std::iota(order.begin(), order.end(), 0u);
  size_t pos = order.size();
  std::vector<float> x(static_cast<size_t>(o.batch) * shard.dim);
  std::vector<uint8_t> y(static_cast<size_t>(o.batch));
  for (int64_t step = at; step < steps && !stop.load(); ++step) {
    const absl::Time t0 = absl::Now();
    for (int b = 0; b < o.batch; ++b) {
      if (pos == order.size()) {
        std::shuffle(order.begin(), order.end(), rng);
        pos = 0;
      }
      const uint32_t i = order[pos++];
      std::copy_n(shard.row(i), shard.dim, x.data() + static_cast<size_t>(b) * shard.dim);
      y[b] = shard.labels[i];
    }
    TrainerStep s;
    s.step = step;
    s.grad = grad;
    link.BeginStep(s);
    s.loss = model->LossAndGradient(params, x.data(), y.data(), static_cast<size_t>(o.batch),
                                    absl::MakeSpan(grad),
                                    [&link](size_t from) { link.GradReadyFrom(from); });
    if (!std::isfinite(s.loss)) {
      // Non-finite parameters give a non-finite loss: going on would only spread them.
      return absl::DataLossError(absl::StrCat(
          "step ", step, ": the training loss is ", s.loss,
          "; the model is no longer finite (diverged, or poisoned by a message that got "
          "through), so this worker stops (docs/robustness.md)"));
    }
    if (const absl::Duration left = o.min_step - (absl::Now() - t0); left > absl::ZeroDuration()) {
      absl::SleepFor(left);
    }
    s.compute_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    s.grad = grad;
    TERN_ASSIGN_OR_RETURN(params, link.Step(s));
    if (o.crash_after_steps > 0 && step + 1 >= o.crash_after_steps) {
      spdlog::warn("worker {}: fault injection: killing this process after {} steps", o.worker_id,
                   step + 1);
      spdlog::default_logger()->flush();
      raise(SIGKILL);
    }
  }
  return absl::OkStatus();
}

}  // namespace tern
