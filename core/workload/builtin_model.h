// Built-in models with hand-written forward and backward passes: softmax regression and a ReLU
// MLP. Parameters live in one flat float vector (what the gossip layer exchanges); Layout() names
// its pieces so a trainer can register them as separate tensors.
//
// Thread-safety: a Model is immutable after construction; every method is const and keeps its
// scratch on the caller's stack or in the caller's buffers, so one Model serves many threads.
#ifndef TERN_CORE_WORKLOAD_BUILTIN_MODEL_H_
#define TERN_CORE_WORKLOAD_BUILTIN_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/model/layout.h"

namespace tern {

struct EvalResult {
  double loss = 0;      // mean cross-entropy
  double accuracy = 0;  // fraction correct
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string Spec() const = 0;
  virtual size_t NumParams() const = 0;
  virtual const std::vector<ParamTensor>& Layout() const = 0;
  // He-style initialisation from `seed` (biases 0).
  virtual void Init(uint64_t seed, absl::Span<float> params) const = 0;
  // Called as the backward pass goes, last layer first: grad[from, end) is final and this call
  // reads the parameters there no more, so a worker may send (and update) them meanwhile.
  using GradReady = absl::FunctionRef<void(size_t from)>;
  // Mean cross-entropy of the batch (x: batch x dim row-major, y: labels) and its gradient,
  // written to `grad` (NumParams() floats).
  virtual float LossAndGradient(absl::Span<const float> params, const float* x, const uint8_t* y,
                                size_t batch, absl::Span<float> grad, GradReady ready) const = 0;
  float LossAndGradient(absl::Span<const float> params, const float* x, const uint8_t* y,
                        size_t batch, absl::Span<float> grad) const {
    return LossAndGradient(params, x, y, batch, grad, [](size_t) {});
  }
  // Loss and accuracy over n examples.
  virtual EvalResult Evaluate(absl::Span<const float> params, const float* x, const uint8_t* y,
                              size_t n) const = 0;
};

// "softmax" (multinomial logistic regression) or "mlp[:hidden=H1xH2...]" (default hidden=128).
absl::StatusOr<std::unique_ptr<Model>> CreateModel(absl::string_view spec, size_t input_dim,
                                                   int num_classes);

// Threads every model's matrix products use (OpenBLAS's pool, process-wide): set once at start,
// before any training. Results may differ in the last bits between thread counts.
void SetComputeThreads(int threads);

}  // namespace tern

#endif  // TERN_CORE_WORKLOAD_BUILTIN_MODEL_H_
