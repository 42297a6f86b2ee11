#include "cli/bench_model.h"

#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "core/workload/blas_core.h"
#include "core/workload/builtin_model.h"

namespace tern {

absl::Status RunBenchModel(const BenchModelOptions& o, int threads) {
  if (o.batch < 1) return absl::InvalidArgumentError("--batch must be >= 1");
  constexpr size_t kDim = 784;
  constexpr int kClasses = 10;
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, CreateModel(o.model, kDim, kClasses));
  std::vector<float> params(model->NumParams()), grad(model->NumParams());
  model->Init(1, absl::MakeSpan(params));
  // Fashion-MNIST-like inputs: pixels in [0, 1].
  const size_t batch = static_cast<size_t>(o.batch);
  std::vector<float> x(batch * kDim);
  std::vector<uint8_t> y(batch);
  const RngKey key = MakeRngKey(7, 0xbe);
  for (size_t i = 0; i < x.size(); ++i) x[i] = Uniform01(key, i);
  for (size_t b = 0; b < batch; ++b) y[b] = static_cast<uint8_t>(b % kClasses);

  float sink = model->LossAndGradient(params, x.data(), y.data(), batch, absl::MakeSpan(grad));
  int64_t steps = 0;
  const absl::Time start = absl::Now();
  absl::Duration spent;
  do {
    sink += model->LossAndGradient(params, x.data(), y.data(), batch, absl::MakeSpan(grad));
    ++steps;
    spent = absl::Now() - start;
  } while (steps < 3 || absl::ToDoubleSeconds(spent) < o.min_seconds);
  std::printf(
      "{\"model\":\"%s\",\"batch\":%d,\"threads\":%d,\"params\":%zu,\"ms_per_step\":%.4f,"
      "\"steps\":%lld,\"loss\":%.4f,\"blas_core\":\"%s\"}\n",
      model->Spec().c_str(), o.batch, threads, model->NumParams(),
      absl::ToDoubleMilliseconds(spent) / static_cast<double>(steps), static_cast<long long>(steps),
      sink / static_cast<float>(steps + 1), BlasCoreName().c_str());
  return absl::OkStatus();
}

}  // namespace tern
