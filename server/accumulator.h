// The open round's accepted updates, in the form the round's aggregation rule needs: FedAvg
// streams each decoded update into a weighted sum (the server never holds one copy per client);
// a robust rule (median, Krum, ...) keeps the updates and aggregates them at the close. Its
// state goes into the checkpoint, so a restarted server finishes the round it was in.
//
// Thread-safety: thread-safe. Adds run concurrently with each other and outside the
// aggregator's lock (FedAvg's sum is striped, each stripe under its own mutex); Aggregate, Save,
// Reset and Restore first wait for every reserved Add to finish.
#ifndef TERN_SERVER_ACCUMULATOR_H_
#define TERN_SERVER_ACCUMULATOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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
                   uint32_t batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Add in two steps: Reserve while the caller decides (under its own lock) that the update
  // counts for this round; AddReserved later, outside that lock, does the work and ends the
  // reservation, also on error. The round cannot be aggregated in between.
  void Reserve() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status AddReserved(uint32_t client, absl::Span<const float> update, double weight,
                           double loss, uint32_t batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a reservation without adding (the update could not be logged).
  void CancelReserved() ABSL_LOCKS_EXCLUDED(mu_);

  size_t count() const ABSL_LOCKS_EXCLUDED(mu_);
  double mean_loss() const ABSL_LOCKS_EXCLUDED(mu_);
  double total_weight() const ABSL_LOCKS_EXCLUDED(mu_);
  double mean_batch() const ABSL_LOCKS_EXCLUDED(mu_);

  // Writes the round's aggregate to `out` (the model's size); false when there is none: nothing
  // was added, or too few updates for the rule (e.g. Krum's n >= 2f + 3).
  absl::StatusOr<bool> Aggregate(absl::Span<float> out) const ABSL_LOCKS_EXCLUDED(mu_);
  // Empties the accumulator for the next round.
  void Reset() ABSL_LOCKS_EXCLUDED(mu_);

  void Save(internal::RoundState* state) const ABSL_LOCKS_EXCLUDED(mu_);
  // DataLoss when `state` does not fit the model or the rule.
  absl::Status Restore(const internal::RoundState& state) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Kept {
    uint32_t client;
    double weight;
    std::vector<float> values;
  };

  // A contiguous slice of FedAvg's running sum.
  struct Stripe {
    absl::Mutex mu;
    size_t begin = 0;
    std::vector<double> sum ABSL_GUARDED_BY(mu);
  };
  static constexpr size_t kStripes = 16;

  // Waits until no reserved Add is running (mu_ held).
  void AwaitIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResetLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running sum, copied out of the stripes (or filled into them).
  std::vector<double> GatherSum() const;
  void ScatterSum(const std::vector<double>& sum);
  absl::Status Check(absl::Span<const float> update, double weight) const;

  const AggregationRule* const rule_;
  const bool streaming_;  // plain FedAvg: a running sum
  const size_t size_;
  std::unique_ptr<Stripe[]> stripes_;  // streaming_ only
  mutable absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // reserved Adds not yet done
  std::vector<Kept> kept_ ABSL_GUARDED_BY(mu_);
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;
  double total_weight_ ABSL_GUARDED_BY(mu_) = 0;
  double loss_sum_ ABSL_GUARDED_BY(mu_) = 0;
  double batch_sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t batch_count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tern

#endif  // TERN_SERVER_ACCUMULATOR_H_
