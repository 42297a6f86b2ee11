// Adam and LAMB as the parameter server runs them, and the frozen-variance step of 1-bit Adam /
// 1-bit LAMB that the server and every client apply to their own copy of the model. Both sides
// call the same function on the same inputs, so their copies stay bit-identical (the delta
// downstream checks this with a CRC).
//
// Thread-safety: plain functions over caller-owned buffers; AdamState is not synchronized.
#ifndef TERN_CORE_MODEL_ADAM_H_
#define TERN_CORE_MODEL_ADAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/model/layout.h"

namespace tern {

struct AdamSettings {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  bool lamb = false;  // layer-wise trust ratio ||x_l|| / ||u_l||, clipped to [0, kMaxTrustRatio]
};

inline constexpr float kMaxTrustRatio = 10.0f;

// "adam" / "lamb" run dense throughout; the "onebit-" ones freeze the variance after warm-up.
bool IsAdamOptimizer(const std::string& name);
bool IsOnebitOptimizer(const std::string& name);
absl::Status CheckOptimizerName(const std::string& name);

struct AdamState {
  std::vector<float> m;      // first moment
  std::vector<float> v;      // second moment (bias-corrected once frozen)
  std::vector<float> ratio;  // LAMB: per tensor, the running mean of the trust ratio
  int64_t steps = 0;

  void Reset(size_t params, size_t tensors);
};

// One dense step t = state->steps + 1 from the mean gradient `g`: updates m, v (and LAMB's ratio
// mean) and writes the step to take into `step` (x += step), bias-corrected as in Adam.
void AdamStep(const AdamSettings& s, const std::vector<ParamTensor>& layout,
              absl::Span<const float> x, absl::Span<const float> g, AdamState* state,
              absl::Span<float> step);

// Ends the warm-up: v becomes its bias-corrected value, to be used unchanged from now on.
void FreezeVariance(const AdamSettings& s, AdamState* state);

// The compressed phase's step on one tensor: x -= lr * ratio * m / (sqrt(v) + eps).
void FrozenAdamStep(float lr, float ratio, float eps, absl::Span<const float> m,
                    absl::Span<const float> v, absl::Span<float> x);

}  // namespace tern

#endif  // TERN_CORE_MODEL_ADAM_H_
