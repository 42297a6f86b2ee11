#include "core/model/adam.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tern {

bool IsAdamOptimizer(const std::string& name) {
  return name == "adam" || name == "lamb" || IsOnebitOptimizer(name);
}

bool IsOnebitOptimizer(const std::string& name) {
  return name == "onebit-adam" || name == "onebit-lamb";
}

absl::Status CheckOptimizerName(const std::string& name) {
  if (name.empty() || name == "sgd" || IsAdamOptimizer(name)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", name, "' (sgd, adam, lamb, onebit-adam, onebit-lamb)"));
}

void AdamState::Reset(size_t params, size_t tensors) {
  m.assign(params, 0.0f);
  v.assign(params, 0.0f);
  ratio.assign(tensors, 1.0f);
  steps = 0;
}

void AdamStep(const AdamSettings& s, const std::vector<ParamTensor>& layout,
              absl::Span<const float> x, absl::Span<const float> g, AdamState* st,
              absl::Span<float> step) {
  const int64_t t = ++st->steps;
  const float c1 = 1.0f - static_cast<float>(std::pow(s.beta1, static_cast<double>(t)));
  const float c2 = 1.0f - static_cast<float>(std::pow(s.beta2, static_cast<double>(t)));
  for (size_t i = 0; i < g.size(); ++i) {
    st->m[i] = s.beta1 * st->m[i] + (1.0f - s.beta1) * g[i];
    st->v[i] = s.beta2 * st->v[i] + (1.0f - s.beta2) * g[i] * g[i];
    step[i] = (st->m[i] / c1) / (std::sqrt(st->v[i] / c2) + s.eps);
  }
  for (size_t l = 0; l < layout.size(); ++l) {
    const ParamTensor& p = layout[l];
    float ratio = 1.0f;
    if (s.lamb) {
      double xn = 0, un = 0;
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        xn += static_cast<double>(x[i]) * x[i];
        un += static_cast<double>(step[i]) * step[i];
      }
      // Zero-initialised tensors (biases) have no scale yet: plain Adam for them.
      ratio = xn > 0 && un > 0 ? std::min(kMaxTrustRatio, static_cast<float>(std::sqrt(xn / un)))
                               : 1.0f;
      // The frozen ratio is the mean over the warm-up.
      st->ratio[l] += (ratio - st->ratio[l]) / static_cast<float>(t);
    }
    for (size_t i = p.offset; i < p.offset + p.numel; ++i) step[i] *= -s.lr * ratio;
  }
}

void FreezeVariance(const AdamSettings& s, AdamState* st) {
  const float c2 = 1.0f - static_cast<float>(std::pow(
                              s.beta2, static_cast<double>(std::max<int64_t>(1, st->steps))));
  for (float& v : st->v) v /= c2;
}

void FrozenAdamStep(float lr, float ratio, float eps, absl::Span<const float> m,
                    absl::Span<const float> v, absl::Span<float> x) {
  const float a = lr * ratio;
  for (size_t i = 0; i < x.size(); ++i) x[i] -= a * m[i] / (std::sqrt(v[i]) + eps);
}

}  // namespace tern
