#include "clients/cpp/local_work.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <random>
#include <utility>

#include "absl/time/clock.h"
#include "core/federated/protocol.h"
#include "spdlog/spdlog.h"

namespace tern {
namespace {

// The norm test of the adaptive batch size (LocalTraining.norm_test_eta) on the rows
// xb[0..b) at x: returns the batch size the test asks for (b when it passes).
size_t NormTestBatch(const Model& model, const float* xb, const uint8_t* yb, size_t b, size_t dim,
                     double eta, size_t max_batch, absl::Span<const float> x) {
  if (b < 2) return std::max<size_t>(b, std::min<size_t>(2, max_batch));
  // One pass, no per-sample copies: sum_s ||g_s - mean||^2 = sum_s ||g_s||^2 - b ||mean||^2.
  const size_t d = x.size();
  std::vector<float> g(d);
  std::vector<double> sum(d, 0.0);
  double sum_sq = 0;
  for (size_t s = 0; s < b; ++s) {
    model.LossAndGradient(x, xb + s * dim, yb + s, 1, absl::MakeSpan(g));
    for (size_t k = 0; k < d; ++k) {
      sum[k] += g[k];
      sum_sq += static_cast<double>(g[k]) * g[k];
    }
  }
  double mean_sq = 0;
  for (size_t k = 0; k < d; ++k) mean_sq += (sum[k] / b) * (sum[k] / b);
  const double var =
      std::max(0.0, sum_sq - static_cast<double>(b) * mean_sq) / static_cast<double>(b - 1);
  const double bound = eta * eta * mean_sq;
  if (!(var / static_cast<double>(b) > bound)) return b;
  const double want = bound > 0 ? std::ceil(var / bound) : static_cast<double>(max_batch);
  return static_cast<size_t>(std::min<double>(want, static_cast<double>(max_batch)));
}

// Copies the examples order[0..n) into a minibatch.
void Gather(const Dataset& train, const uint32_t* order, size_t n, std::vector<float>* xb,
            std::vector<uint8_t>* yb) {
  xb->resize(n * train.dim);
  yb->resize(n);
  for (size_t b = 0; b < n; ++b) {
    std::copy_n(train.row(order[b]), train.dim, xb->data() + b * train.dim);
    (*yb)[b] = train.labels[order[b]];
  }
}

// The batch size after the norm test on one minibatch of the current size, drawn as the
// round's data order would be.
size_t RunNormTest(const WorkData& data, const v1::LocalTraining& l, std::mt19937_64& rng,
                   size_t batch, absl::Span<const float> x) {
  std::vector<uint32_t> probe = *data.part;
  std::shuffle(probe.begin(), probe.end(), rng);
  const size_t n = std::min(batch, probe.size());
  std::vector<float> xb;
  std::vector<uint8_t> yb;
  Gather(*data.train, probe.data(), n, &xb, &yb);
  const size_t cap = std::max<size_t>(
      batch, std::min<size_t>(l.max_batch() > 0 ? l.max_batch() : 1024, probe.size()));
  return std::max(batch, NormTestBatch(*data.model, xb.data(), yb.data(), n, data.train->dim,
                                       l.norm_test_eta(), cap, x));
}

// SGD with the task's momentum from `x`, in place, with minibatches of *batch (which the norm
// test may raise first). Returns the mean minibatch loss.
double TrainLocally(const WorkData& data, const v1::LocalTraining& l, uint64_t seed,
                    absl::Span<float> x, size_t* batch) {
  std::mt19937_64 rng(seed);
  if (l.norm_test_eta() > 0 && !data.part->empty()) {
    *batch = RunNormTest(data, l, rng, *batch, x);
  }
  const size_t b = std::max<size_t>(1, *batch);
  std::vector<uint32_t> order = *data.part;
  size_t pos = order.size();
  int64_t steps = l.local_steps();
  if (l.local_epochs() > 0) {
    steps =
        static_cast<int64_t>(l.local_epochs()) * static_cast<int64_t>((order.size() + b - 1) / b);
  }
  std::vector<float> xb, grad(x.size()), velocity(x.size(), 0.0f);
  std::vector<uint8_t> yb;
  double loss_sum = 0;
  for (int64_t s = 0; s < steps; ++s) {
    // Epoch-style passes: the last batch of a pass is short rather than wrapping around.
    if (pos == order.size()) {
      std::shuffle(order.begin(), order.end(), rng);
      pos = 0;
    }
    const size_t n = std::min(b, order.size() - pos);
    Gather(*data.train, order.data() + pos, n, &xb, &yb);
    pos += n;
    loss_sum += data.model->LossAndGradient(x, xb.data(), yb.data(), n, absl::MakeSpan(grad));
    for (size_t k = 0; k < x.size(); ++k) {
      velocity[k] = l.momentum() * velocity[k] + grad[k];
      x[k] -= l.lr() * velocity[k];
    }
  }
  return steps > 0 ? loss_sum / static_cast<double>(steps) : 0.0;
}

// The batch size a round starts from: the adaptive one once the norm test ran, else the task's.
size_t StartBatch(const v1::LocalTraining& l, size_t adaptive) {
  return adaptive == 0 || l.norm_test_eta() <= 0 ? std::max<uint32_t>(1, l.batch()) : adaptive;
}

// One round's local steps from `start`, timed; `batch` 0: the task's.
WorkResult TrainFrom(const WorkData& data, const v1::LocalTraining& l, uint64_t seed,
                     std::vector<float> start, size_t batch) {
  const absl::Time t0 = absl::Now();
  batch = StartBatch(l, batch);
  WorkResult w;
  w.update = std::move(start);
  w.loss = TrainLocally(data, l, seed, absl::MakeSpan(w.update), &batch);
  w.batch = static_cast<uint32_t>(batch);
  w.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  return w;
}

void SayBatch(const std::string& name, uint64_t round, size_t before, size_t after) {
  if (after != before) {
    spdlog::info("{}: round {}: norm test raised the batch from {} to {}", name, round, before,
                 after);
  }
}

class LocalSgd final : public LocalWork {
 public:
  LocalSgd(WorkData data, std::string name) : data_(data), name_(std::move(name)) {}

  absl::StatusOr<WorkResult> Run(const v1::Task& task, const std::vector<float>& x0,
                                 uint64_t data_seed, const AdamState*) override {
    WorkResult w = TrainFrom(data_, task.local(), data_seed, x0, batch_);
    SayBatch(name_, task.round(), StartBatch(task.local(), batch_), w.batch);
    batch_ = w.batch;
    for (size_t k = 0; k < x0.size(); ++k) w.update[k] -= x0[k];
    return w;
  }
  bool Serves(const v1::Task& task) const override {
    return task.has_local() && task.local().anchor_pull() == 0;
  }

 private:
  const WorkData data_;
  const std::string name_;
  size_t batch_ = 0;  // the adaptive batch size, once the norm test ran
};

class OverlapLocalSgd final : public LocalWork {
 public:
  OverlapLocalSgd(WorkData data, std::string name) : data_(data), name_(std::move(name)) {}
  ~OverlapLocalSgd() override {
    if (next_.valid()) next_.wait();
  }

  // This round's local steps ran from the client's own model while the anchor x0 was averaged
  // and fetched (they run now in the first round). Pull towards the anchor; push the pulled
  // model's offset from it; start the next round's steps from the pulled model.
  absl::StatusOr<WorkResult> Run(const v1::Task& task, const std::vector<float>& x0,
                                 uint64_t data_seed, const AdamState*) override {
    const v1::LocalTraining& l = task.local();
    if (own_.empty()) own_ = x0;
    WorkResult w = next_.valid() ? next_.get() : TrainFrom(data_, l, data_seed, own_, batch_);
    const float a = l.anchor_pull();
    for (size_t k = 0; k < x0.size(); ++k) w.update[k] -= a * (w.update[k] - x0[k]);
    own_ = w.update;
    for (size_t k = 0; k < x0.size(); ++k) w.update[k] -= x0[k];
    SayBatch(name_, task.round(), StartBatch(l, batch_), w.batch);
    batch_ = w.batch;
    next_ =
        std::async(std::launch::async, [data = data_, l, seed = data_seed + 1, start = own_,
                                        b = batch_] { return TrainFrom(data, l, seed, start, b); });
    return w;
  }
  bool Serves(const v1::Task& task) const override {
    return task.has_local() && task.local().anchor_pull() > 0;
  }

 private:
  const WorkData data_;
  const std::string name_;
  std::vector<float> own_;  // the client's own model x
  std::future<WorkResult> next_;
  size_t batch_ = 0;
};

class GradientStep final : public LocalWork {
 public:
  explicit GradientStep(WorkData data) : data_(data) {}

  absl::StatusOr<WorkResult> Run(const v1::Task& task, const std::vector<float>& x0,
                                 uint64_t data_seed, const AdamState* adam) override {
    const absl::Time t0 = absl::Now();
    const v1::GradientStep& g = task.gradient();
    WorkResult w;
    w.batch = std::max<uint32_t>(1, g.batch());
    w.update.assign(x0.size(), 0.0f);
    w.loss = Gradient(w.batch, data_seed, x0, absl::MakeSpan(w.update));
    if (InOnebitPhase(task)) {  // push this worker's momentum, not its gradient
      if (adam == nullptr || adam->m.size() != x0.size()) {
        return absl::FailedPreconditionError("1-bit momentum without the optimizer state");
      }
      const float b1 = g.beta1();
      for (size_t k = 0; k < x0.size(); ++k) {
        w.update[k] = b1 * adam->m[k] + (1.0f - b1) * w.update[k];
      }
    }
    w.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    return w;
  }
  bool Serves(const v1::Task& task) const override { return task.has_gradient(); }

 private:
  // The gradient of one minibatch of `batch` distinct examples at `x`; returns its loss.
  float Gradient(size_t batch, uint64_t seed, absl::Span<const float> x, absl::Span<float> grad) {
    std::mt19937_64 rng(seed);
    std::vector<uint32_t> order = *data_.part;
    const size_t n = std::min(batch, order.size());
    for (size_t i = 0; i < n; ++i) {  // partial Fisher-Yates
      std::uniform_int_distribution<size_t> pick(i, order.size() - 1);
      std::swap(order[i], order[pick(rng)]);
    }
    std::vector<float> xb;
    std::vector<uint8_t> yb;
    Gather(*data_.train, order.data(), n, &xb, &yb);
    return data_.model->LossAndGradient(x, xb.data(), yb.data(), n, grad);
  }

  const WorkData data_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LocalWork>> NewLocalWork(const v1::Task& task, WorkData data,
                                                        std::string name) {
  switch (task.work_case()) {
    case v1::Task::kLocal:
      if (task.local().anchor_pull() > 0) {
        return std::make_unique<OverlapLocalSgd>(data, std::move(name));
      }
      return std::make_unique<LocalSgd>(data, std::move(name));
    case v1::Task::kGradient:
      return std::make_unique<GradientStep>(data);
    case v1::Task::WORK_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the task names no work (local or gradient)");
}

}  // namespace tern
