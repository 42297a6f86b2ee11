// The open round's accepted updates, in the form the round's aggregation rule needs: FedAvg
// streams each decoded update into a weighted sum (the server never holds one copy per client);
// a robust rule (median, Krum, ...) keeps the updates and aggregates them at the close. Its
// state goes into the checkpoint, so a restarted server finishes the round it was in.
//
// Thread-safety: thread-compatible; the aggregator guards it with its own mutex.
#ifndef TERN_SERVER_ACCUMULATOR_H_
#define TERN_SERVER_ACCUMULATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/aggregation.h"
#include "tern/internal/checkpoint.pb.h"

namespace tern {

class RoundAccumulator {
 public:
  // `rule` must outlive the accumulator; `size` is the model's parameter count.
  RoundAccumulator(const AggregationRule* rule, size_t size);

  // Adds one client's decoded update with `weight` > 0 (finite), its mean local `loss` and
  // minibatch size (`batch` 0: not reported). A wrong size or weight is an error and changes
  // nothing.
  absl::Status Add(uint32_t client, absl::Span<const float> update, double weight, double loss,
                   uint32_t batch);

  size_t count() const { return count_; }
  double mean_loss() const { return total_weight_ > 0 ? loss_sum_ / total_weight_ : 0.0; }
  double mean_batch() const { return batch_count_ > 0 ? batch_sum_ / batch_count_ : 0.0; }

  // Writes the round's aggregate to `out` (the model's size); false when there is none: nothing
  // was added, or too few updates for the rule (e.g. Krum's n >= 2f + 3).
  absl::StatusOr<bool> Aggregate(absl::Span<float> out) const;
  // Empties the accumulator for the next round.
  void Reset();

  void Save(internal::RoundState* state) const;
  // DataLoss when `state` does not fit the model or the rule.
  absl::Status Restore(const internal::RoundState& state);

 private:
  struct Kept {
    uint32_t client;
    double weight;
    std::vector<float> values;
  };

  const AggregationRule* const rule_;
  const bool streaming_;  // plain FedAvg: a running sum
  const size_t size_;
  std::vector<double> sum_;
  std::vector<Kept> kept_;
  size_t count_ = 0;
  double total_weight_ = 0;
  double loss_sum_ = 0;
  double batch_sum_ = 0;
  uint64_t batch_count_ = 0;
};

}  // namespace tern

#endif  // TERN_SERVER_ACCUMULATOR_H_
