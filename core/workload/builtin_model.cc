#include "core/workload/builtin_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/rng.h"
#include "common/spec.h"
#include "common/status_macros.h"

namespace tern {
namespace {

// y[b, :] = bias + x[b, :] * w, with w stored [in, out]: the inner loop is an axpy over `out`,
// which vectorises without reassociating any sum.
void Affine(const float* x, size_t batch, size_t in, const float* w, const float* bias, size_t out,
            float* y) {
  for (size_t b = 0; b < batch; ++b) {
    float* yb = y + b * out;
    std::memcpy(yb, bias, out * sizeof(float));
    const float* xb = x + b * in;
    for (size_t k = 0; k < in; ++k) {
      const float a = xb[k];
      if (a == 0.0f) continue;  // ReLU outputs are half zeros
      const float* wk = w + k * out;
      for (size_t o = 0; o < out; ++o) yb[o] += a * wk[o];
    }
  }
}

// gw[k, :] += x[b, k] * dy[b, :] over the batch; gb += sum_b dy[b, :].
void AffineGrad(const float* x, size_t batch, size_t in, const float* dy, size_t out, float* gw,
                float* gb) {
  for (size_t b = 0; b < batch; ++b) {
    const float* xb = x + b * in;
    const float* dyb = dy + b * out;
    for (size_t o = 0; o < out; ++o) gb[o] += dyb[o];
    for (size_t k = 0; k < in; ++k) {
      const float a = xb[k];
      if (a == 0.0f) continue;
      float* gk = gw + k * out;
      for (size_t o = 0; o < out; ++o) gk[o] += a * dyb[o];
    }
  }
}

// dx[b, k] = sum_o dy[b, o] * w[k, o], masked by the ReLU (x[b, k] > 0).
void BackwardInput(const float* dy, size_t batch, const float* w, size_t in, size_t out,
                   const float* relu_out, float* dx) {
  for (size_t b = 0; b < batch; ++b) {
    const float* dyb = dy + b * out;
    for (size_t k = 0; k < in; ++k) {
      if (relu_out[b * in + k] <= 0.0f) {
        dx[b * in + k] = 0.0f;
        continue;
      }
      const float* wk = w + k * out;
      float acc[8] = {};
      size_t o = 0;
      for (; o + 8 <= out; o += 8) {
        for (int j = 0; j < 8; ++j) acc[j] += dyb[o + j] * wk[o + j];
      }
      float s = 0;
      for (; o < out; ++o) s += dyb[o] * wk[o];
      for (float v : acc) s += v;
      dx[b * in + k] = s;
    }
  }
}

// In place: logits -> softmax probabilities; returns the summed cross-entropy of the labels.
double SoftmaxCrossEntropy(float* logits, const uint8_t* y, size_t batch, size_t classes,
                           size_t* correct) {
  double loss = 0;
  for (size_t b = 0; b < batch; ++b) {
    float* z = logits + b * classes;
    const size_t argmax = std::max_element(z, z + classes) - z;
    if (correct != nullptr && argmax == y[b]) ++*correct;
    const float m = z[argmax];
    double sum = 0;
    for (size_t c = 0; c < classes; ++c) sum += (z[c] = std::exp(z[c] - m));
    const float inv = static_cast<float>(1.0 / sum);
    for (size_t c = 0; c < classes; ++c) z[c] *= inv;
    loss += -std::log(std::max(static_cast<double>(z[y[b]]), 1e-30));
  }
  return loss;
}

// Softmax regression is the MLP with no hidden layer.
class Mlp final : public Model {
 public:
  Mlp(std::string spec, size_t input_dim, int num_classes, std::vector<size_t> hidden)
      : spec_(std::move(spec)) {
    widths_.push_back(input_dim);
    for (size_t h : hidden) widths_.push_back(h);
    widths_.push_back(static_cast<size_t>(num_classes));
    size_t offset = 0;
    for (size_t l = 0; l + 1 < widths_.size(); ++l) {
      const std::string name = widths_.size() == 2 ? "linear" : absl::StrCat("fc", l + 1);
      ParamTensor w{name + ".weight",
                    {static_cast<int64_t>(widths_[l]), static_cast<int64_t>(widths_[l + 1])},
                    offset,
                    widths_[l] * widths_[l + 1]};
      offset += w.numel;
      ParamTensor b{name + ".bias", {static_cast<int64_t>(widths_[l + 1])}, offset, widths_[l + 1]};
      offset += b.numel;
      layout_.push_back(w);
      layout_.push_back(b);
    }
    num_params_ = offset;
  }

  std::string Spec() const override { return spec_; }
  size_t NumParams() const override { return num_params_; }
  const std::vector<ParamTensor>& Layout() const override { return layout_; }

  void Init(uint64_t seed, absl::Span<float> params) const override {
    const RngKey key = MakeRngKey(seed, 0x1417);
    for (size_t l = 0; l < NumLayers(); ++l) {
      const ParamTensor& w = layout_[2 * l];
      const float scale = std::sqrt(2.0f / widths_[l]);
      for (size_t i = 0; i < w.numel; ++i) params[w.offset + i] = scale * Normal(key, w.offset + i);
      const ParamTensor& b = layout_[2 * l + 1];
      std::fill_n(params.begin() + b.offset, b.numel, 0.0f);
    }
  }

  float LossAndGradient(absl::Span<const float> params, const float* x, const uint8_t* y,
                        size_t batch, absl::Span<float> grad) const override {
    std::vector<std::vector<float>> acts;  // acts[l]: output of layer l (post-ReLU for hidden)
    Forward(params, x, batch, &acts);
    float* dlogits = acts.back().data();
    const double loss = SoftmaxCrossEntropy(dlogits, y, batch, widths_.back(), nullptr);
    // d(mean CE)/dlogits = (p - onehot) / batch.
    const float inv_batch = 1.0f / static_cast<float>(batch);
    for (size_t b = 0; b < batch; ++b) {
      float* z = dlogits + b * widths_.back();
      z[y[b]] -= 1.0f;
      for (size_t c = 0; c < widths_.back(); ++c) z[c] *= inv_batch;
    }
    std::fill(grad.begin(), grad.end(), 0.0f);
    std::vector<float> dy = std::move(acts.back());
    for (size_t l = NumLayers(); l-- > 0;) {
      const float* in = l == 0 ? x : acts[l - 1].data();
      const ParamTensor& w = layout_[2 * l];
      const ParamTensor& b = layout_[2 * l + 1];
      AffineGrad(in, batch, widths_[l], dy.data(), widths_[l + 1], grad.data() + w.offset,
                 grad.data() + b.offset);
      if (l > 0) {
        std::vector<float> dx(batch * widths_[l]);
        BackwardInput(dy.data(), batch, params.data() + w.offset, widths_[l], widths_[l + 1],
                      acts[l - 1].data(), dx.data());
        dy = std::move(dx);
      }
    }
    return static_cast<float>(loss / batch);
  }

  EvalResult Evaluate(absl::Span<const float> params, const float* x, const uint8_t* y,
                      size_t n) const override {
    constexpr size_t kChunk = 256;
    double loss = 0;
    size_t correct = 0;
    std::vector<std::vector<float>> acts;
    for (size_t i = 0; i < n; i += kChunk) {
      const size_t m = std::min(kChunk, n - i);
      Forward(params, x + i * widths_[0], m, &acts);
      loss += SoftmaxCrossEntropy(acts.back().data(), y + i, m, widths_.back(), &correct);
    }
    EvalResult r;
    if (n > 0) {
      r.loss = loss / n;
      r.accuracy = static_cast<double>(correct) / n;
    }
    return r;
  }

 private:
  size_t NumLayers() const { return widths_.size() - 1; }

  void Forward(absl::Span<const float> params, const float* x, size_t batch,
               std::vector<std::vector<float>>* acts) const {
    acts->resize(NumLayers());
    const float* in = x;
    for (size_t l = 0; l < NumLayers(); ++l) {
      std::vector<float>& out = (*acts)[l];
      out.resize(batch * widths_[l + 1]);
      Affine(in, batch, widths_[l], params.data() + layout_[2 * l].offset,
             params.data() + layout_[2 * l + 1].offset, widths_[l + 1], out.data());
      if (l + 1 < NumLayers()) {
        for (float& v : out) v = v > 0.0f ? v : 0.0f;
      }
      in = out.data();
    }
  }

  const std::string spec_;
  std::vector<size_t> widths_;
  std::vector<ParamTensor> layout_;
  size_t num_params_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CreateModel(absl::string_view spec, size_t input_dim,
                                                   int num_classes) {
  if (input_dim == 0 || num_classes < 2) {
    return absl::InvalidArgumentError("a model needs input_dim >= 1 and >= 2 classes");
  }
  TERN_ASSIGN_OR_RETURN(auto parsed, SpecParams::ParseSpec(spec));
  auto& [name, params] = parsed;
  std::vector<size_t> hidden;
  if (name == "mlp") {
    const std::string h = params.String("hidden", "128");
    for (absl::string_view part : absl::StrSplit(h, 'x')) {
      size_t width;
      if (!absl::SimpleAtoi(part, &width) || width < 1 || width > 65536) {
        return absl::InvalidArgumentError(
            absl::StrCat("mlp: hidden sizes are HxHx... with 1 <= H <= 65536, got '", h, "'"));
      }
      hidden.push_back(width);
    }
  } else if (name != "softmax") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model '", name, "' (softmax, mlp:hidden=128x64)"));
  }
  TERN_RETURN_IF_ERROR(params.CheckAllUsed(absl::StrCat("model '", name, "'")));
  const std::string canonical =
      name == "mlp" ? absl::StrCat("mlp:hidden=", absl::StrJoin(hidden, "x")) : "softmax";
  return std::make_unique<Mlp>(canonical, input_dim, num_classes, std::move(hidden));
}

}  // namespace tern
