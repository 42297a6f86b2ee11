// A C++ trainer driving a tern worker (`tern worker --trainer=external`) over its Trainer
// service, through tern's C++ client library (clients/cpp/trainer_link.h): register the model,
// then each step send the gradient and get back the worker's gossip-averaged parameters. The
// model: the same linear regression as linear_client.cc, on this worker's own inputs.
//
//   tern worker --trainer=external --id=0 --workers=2 --listen=127.0.0.1:7000 \
//       --peers=127.0.0.1:7000,127.0.0.1:7001 --algorithm=dpsgd --lr=0.05 --momentum=0 &
//   (the same with --id=1 --listen=127.0.0.1:7001)
//   worker_trainer 127.0.0.1:7000 0 200 & worker_trainer 127.0.0.1:7001 1 200
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "clients/cpp/trainer_link.h"
#include "core/rpc/channel.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s WORKER_ADDRESS INDEX STEPS\n", argv[0]);
    return 2;
  }
  const int index = std::stoi(argv[2]), steps = std::stoi(argv[3]);
  constexpr int kIn = 8;  // y = w* . x + 1, w*[k] = 1 / (k + 1)
  const std::vector<tern::ParamTensor> layout = {{"w", {kIn}, 0, kIn}, {"b", {1}, kIn, 1}};
  std::vector<float> params(kIn + 1, 0.0f), grad(kIn + 1);
  std::unique_ptr<tern::TrainerLink> worker =
      tern::NewGrpcTrainerLink(tern::MakeChannel(argv[1]), absl::Seconds(60));
  absl::StatusOr<int64_t> first = worker->Register(layout, params);
  if (!first.ok()) {
    std::fprintf(stderr, "register: %s\n", first.status().ToString().c_str());
    return 1;
  }
  std::mt19937 rng(index);
  std::normal_distribution<float> n(0, 1);
  float loss = 0;
  for (int64_t step = *first; step < steps; ++step) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    loss = 0;
    for (int e = 0; e < 16; ++e) {  // a minibatch of this worker's data
      float x[kIn], err = params[kIn] - 1.0f;
      for (int k = 0; k < kIn; ++k) {
        x[k] = n(rng) + 0.5f * index;
        err += (params[k] - 1.0f / (k + 1)) * x[k];
      }
      loss += err * err / 16;
      for (int k = 0; k < kIn; ++k) grad[k] += 2 * err * x[k] / 16;
      grad[kIn] += 2 * err / 16;
    }
    tern::TrainerStep s;
    s.step = step;
    s.loss = loss;
    s.grad = grad;
    absl::StatusOr<absl::Span<const float>> next = worker->Step(s);
    if (!next.ok()) {
      std::fprintf(stderr, "step %lld: %s\n", static_cast<long long>(step),
                   next.status().ToString().c_str());
      return 1;
    }
    params.assign(next->begin(), next->end());
  }
  std::printf("worker %d: %d steps, last minibatch loss %.5f, b = %.4f\n", index, steps, loss,
              params[kIn]);
  return 0;
}
