// The embedded default workload: a C++ trainer (softmax or MLP on Fashion-MNIST, or synthetic
// data when the dataset is absent) that drives a worker through the Trainer gRPC service exactly
// as a PyTorch trainer would: Register the model, then each step send the gradient and take the
// parameters back.
//
// Thread-safety: RunBuiltinTrainer blocks its calling thread; `stop` may be set from any thread.
#ifndef TERN_CLIENTS_CPP_BUILTIN_TRAINER_H_
#define TERN_CLIENTS_CPP_BUILTIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace tern {

struct BuiltinTrainerOptions {
  std::string model = "mlp";
  std::string data_dir;  // "" = auto-detect, synthetic when absent
  std::string partition = "iid";
  int batch = 32;
  int epochs = 1;
  int worker_id = 0;
  int num_workers = 1;
  uint64_t seed = 1;  // same on every worker: data split and initial model
  absl::Duration step_timeout = absl::Minutes(5);
};

// Steps every worker takes per epoch: ceil(train_size / (workers * batch)), so that together
// they see the training set once per epoch whatever the partition's sizes.
int64_t StepsPerEpoch(size_t train_size, int workers, int batch);

absl::Status RunBuiltinTrainer(const std::shared_ptr<grpc::Channel>& channel,
                               const BuiltinTrainerOptions& options, const std::atomic<bool>& stop);

}  // namespace tern

#endif  // TERN_CLIENTS_CPP_BUILTIN_TRAINER_H_
