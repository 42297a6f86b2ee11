#include "core/workload/builtin_model.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cblas.h"
#include "common/rng.h"
#include "common/spec.h"
#include "common/status_macros.h"

// Exported by OpenBLAS (pthread build) but not declared in its headers.
extern "C" int blas_thread_shutdown_(void);

namespace tern {
namespace {

// BLAS dimensions are ints; CreateModel caps every width at 65536 and a batch is far smaller.
blasint Int(size_t n) { return static_cast<blasint>(n); }

// The three products of a dense layer, each one OpenBLAS sgemm over row-major matrices;
// w is stored [in, out].
//
// y[batch, out] = x[batch, in] * w + bias.
void Affine(const float* x, size_t batch, size_t in, const float* w, const float* bias, size_t out,
            float* y) {
  for (size_t b = 0; b < batch; ++b) std::memcpy(y + b * out, bias, out * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Int(batch), Int(out), Int(in), 1.0f, x,
              Int(in), w, Int(out), 1.0f, y, Int(out));
}

// gw[in, out] = x^T * dy; gb = sum over the batch of dy. Both overwritten.
void AffineGrad(const float* x, size_t batch, size_t in, const float* dy, size_t out, float* gw,
                float* gb) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Int(in), Int(out), Int(batch), 1.0f, x,
              Int(in), dy, Int(out), 0.0f, gw, Int(out));
  std::fill_n(gb, out, 0.0f);
  for (size_t b = 0; b < batch; ++b) {
    const float* dyb = dy + b * out;
    for (size_t o = 0; o < out; ++o) gb[o] += dyb[o];
  }
}

// dx[batch, in] = dy * w^T, masked by the ReLU (relu_out > 0).
void BackwardInput(const float* dy, size_t batch, const float* w, size_t in, size_t out,
                   const float* relu_out, float* dx) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Int(batch), Int(in), Int(out), 1.0f, dy,
              Int(out), w, Int(out), 0.0f, dx, Int(in));
  for (size_t i = 0; i < batch * in; ++i) {
    if (relu_out[i] <= 0.0f) dx[i] = 0.0f;
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

  using Model::LossAndGradient;
  float LossAndGradient(absl::Span<const float> params, const float* x, const uint8_t* y,
                        size_t batch, absl::Span<float> grad, GradReady ready) const override {
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
      ready(w.offset);  // layer l's weights and bias (after them in the layout) are done
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

void SetComputeThreads(int threads) {
  // OpenBLAS starts its thread pool when the library loads, before main() can block the signals
  // the daemons wait for with sigwait(): a SIGTERM could land on a pool thread and kill the
  // process. So the pool is stopped and made again here with every signal blocked; its threads
  // inherit that mask and never take a signal.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  blas_thread_shutdown_();
  openblas_set_num_threads(std::max(1, threads));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

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
