// A Participant of the C++ client library whose local work minimizes 0.5 ||x - t||^2 toward its
// own target t: the aggregator tests' model (clients/cpp/aggregator_client_test.cc,
// edge_uplink_test.cc), whose FedAvg and parameter-server fixed point is the examples-weighted
// mean of the targets and whose rounds a test can follow by hand (Pull).
//
// Thread-safety: a Participant, called from its client's thread only.
#ifndef TERN_TESTS_TESTING_QUADRATIC_PARTICIPANT_H_
#define TERN_TESTS_TESTING_QUADRATIC_PARTICIPANT_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "clients/cpp/aggregator_client.h"

namespace tern::testing {

// Two tensors ("w" 3x2, "b" 2), pulled toward this participant's target.
class QuadraticParticipant : public Participant {
 public:
  QuadraticParticipant(std::vector<float> target, uint64_t examples)
      : target_(std::move(target)), examples_(examples) {
    layout_ = {{"w", {3, 2}, 0, 6}, {"b", {2}, 6, 2}};
  }
  const std::vector<ParamTensor>& Layout() const override { return layout_; }
  absl::Status InitialModel(absl::Span<float> x) override {
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i);
    return absl::OkStatus();
  }
  uint64_t NumExamples() const override { return examples_; }
  absl::StatusOr<WorkResult> Work(const v1::Task& task, const std::vector<float>& global,
                                  const WorkContext& context) override {
    WorkResult w;
    w.update.resize(global.size());
    if (task.has_gradient()) {  // ps: the gradient at the round's model
      for (size_t i = 0; i < global.size(); ++i) w.update[i] = global[i] - target_[i];
    } else {  // local steps of gradient descent; the update is the change they made
      const std::vector<float> x = Pull(global, task.local().local_steps(), task.local().lr());
      for (size_t i = 0; i < x.size(); ++i) w.update[i] = x[i] - global[i];
    }
    w.batch = 1;
    ++rounds_;
    if (broken_) w.update.pop_back();
    return w;
  }
  // `steps` steps of gradient descent from `x` at rate `lr`.
  std::vector<float> Pull(std::vector<float> x, uint32_t steps, float lr) const {
    for (uint32_t s = 0; s < steps; ++s) {
      for (size_t i = 0; i < x.size(); ++i) x[i] -= lr * (x[i] - target_[i]);
    }
    return x;
  }
  int rounds() const { return rounds_; }
  // Its updates come one value short from now on.
  void Break() { broken_ = true; }
  std::vector<bool> ExactTensors() const override { return exact_; }
  void SetExact(std::vector<bool> exact) { exact_ = std::move(exact); }

 private:
  std::vector<ParamTensor> layout_;
  std::vector<float> target_;
  uint64_t examples_;
  int rounds_ = 0;
  bool broken_ = false;
  std::vector<bool> exact_;
};

}  // namespace tern::testing

#endif  // TERN_TESTS_TESTING_QUADRATIC_PARTICIPANT_H_
