// A C++ trainer with a model of its own in an aggregator's rounds, through tern's C++ client
// library (clients/cpp/aggregator_client.h). The model: linear regression y = W x + b on this
// client's synthetic data (the true W and b are the same everywhere, the inputs are not); the
// local work: the task's local SGD steps, or in a ps run one minibatch's gradient.
//
//   tern server --mode=federated --min_clients=2 --clients_per_round=2 --rounds=20 \
//       --local_epochs=0 --local_steps=10 --lr=0.05 --port_file=port &
//   linear_client 127.0.0.1:$(cat port) 0 & linear_client 127.0.0.1:$(cat port) 1
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "clients/cpp/aggregator_client.h"

namespace {

constexpr int kIn = 8, kOut = 2;

class LinearRegression : public tern::Participant {
 public:
  explicit LinearRegression(int seed) : rng_(seed) {
    std::normal_distribution<float> n(0, 1);
    for (int i = 0; i < 512; ++i) {  // y = W* x + b* with W*[o][i] = (o + 1) / (i + 1), b* = 1
      std::vector<float> x(kIn), y(kOut, 1.0f);
      for (int k = 0; k < kIn; ++k) x[k] = n(rng_) + 0.5f * seed;  // each client's own inputs
      for (int o = 0; o < kOut; ++o)
        for (int k = 0; k < kIn; ++k) y[o] += (o + 1.0f) / (k + 1.0f) * x[k];
      xs_.push_back(x);
      ys_.push_back(y);
    }
  }
  const std::vector<tern::ParamTensor>& Layout() const override { return layout_; }
  absl::Status InitialModel(absl::Span<float> w) override {
    for (float& v : w) v = 0;
    return absl::OkStatus();
  }
  uint64_t NumExamples() const override { return xs_.size(); }
  // How far the last round's global model is from the true W* and b*.
  float ErrorOfLastModel() const {
    float worst = 0;
    for (int o = 0; o < kOut; ++o) {
      for (int k = 0; k < kIn; ++k) {
        worst = std::max(worst, std::abs(last_global_[o * kIn + k] - (o + 1.0f) / (k + 1.0f)));
      }
      worst = std::max(worst, std::abs(last_global_[kOut * kIn + o] - 1.0f));
    }
    return worst;
  }

  absl::StatusOr<tern::WorkResult> Work(const tern::v1::Task& task,
                                        const std::vector<float>& global,
                                        const tern::WorkContext&) override {
    last_global_ = global;
    tern::WorkResult r;
    r.batch = 16;
    std::vector<float> w = global, g(w.size());
    if (task.has_gradient()) {  // ps: the gradient at the round's model
      r.loss = Gradient(w, r.batch, g);
      r.update = g;
      return r;
    }
    for (uint32_t s = 0; s < task.local().local_steps(); ++s) {  // local SGD
      r.loss = Gradient(w, r.batch, g);
      for (size_t i = 0; i < w.size(); ++i) w[i] -= task.local().lr() * g[i];
    }
    r.update.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) r.update[i] = w[i] - global[i];  // the change made
    return r;
  }

 private:
  // Mean squared error's gradient over a minibatch (W row-major [out, in], then b).
  float Gradient(const std::vector<float>& w, int batch, std::vector<float>& g) {
    std::fill(g.begin(), g.end(), 0.0f);
    std::uniform_int_distribution<size_t> pick(0, xs_.size() - 1);
    float loss = 0;
    for (int e = 0; e < batch; ++e) {
      const size_t j = pick(rng_);
      for (int o = 0; o < kOut; ++o) {
        float err = w[kOut * kIn + o] - ys_[j][o];
        for (int k = 0; k < kIn; ++k) err += w[o * kIn + k] * xs_[j][k];
        loss += err * err / batch;
        for (int k = 0; k < kIn; ++k) g[o * kIn + k] += 2 * err * xs_[j][k] / batch;
        g[kOut * kIn + o] += 2 * err / batch;
      }
    }
    return loss;
  }

  const std::vector<tern::ParamTensor> layout_ = {{"linear.weight", {kOut, kIn}, 0, kOut* kIn},
                                                  {"linear.bias", {kOut}, kOut* kIn, kOut}};
  std::mt19937 rng_;
  std::vector<std::vector<float>> xs_, ys_;
  std::vector<float> last_global_ = std::vector<float>(kOut * kIn + kOut, 0.0f);
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s SERVER_ADDRESS CLIENT_INDEX\n", argv[0]);
    return 2;
  }
  const int index = std::stoi(argv[2]);
  LinearRegression model(index);
  tern::AggregatorClientOptions options;
  options.name = "linear-" + std::to_string(index);
  std::atomic<bool> stop{false};
  absl::StatusOr<tern::FedClientStats> stats =
      tern::RunAggregatorClient(argv[1], tern::TlsFiles{}, options, &model, stop);
  if (!stats.ok()) {
    std::fprintf(stderr, "%s\n", stats.status().ToString().c_str());
    return 1;
  }
  std::printf("%s: %lld rounds, %lld updates accepted; the last global model is %.4f off W*, b*\n",
              options.name.c_str(), static_cast<long long>(stats->rounds_trained),
              static_cast<long long>(stats->updates_accepted), model.ErrorOfLastModel());
  return 0;
}
