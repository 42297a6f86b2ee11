#include "server/accumulator.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tern {

RoundAccumulator::RoundAccumulator(const AggregationRule* rule, size_t size)
    : rule_(rule), streaming_(rule->Spec() == "fedavg"), size_(size) {
  if (streaming_) sum_.assign(size_, 0.0);
}

absl::Status RoundAccumulator::Add(uint32_t client, absl::Span<const float> update, double weight,
                                   double loss, uint32_t batch) {
  if (!(weight > 0) || !std::isfinite(weight)) {
    return absl::InvalidArgumentError(absl::StrCat("weight must be positive, got ", weight));
  }
  if (update.size() != size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("update of ", update.size(), " values for a model of ", size_));
  }
  if (streaming_) {
    for (size_t i = 0; i < size_; ++i) sum_[i] += weight * update[i];
  } else {
    kept_.push_back({client, weight, {update.begin(), update.end()}});
  }
  ++count_;
  total_weight_ += weight;
  loss_sum_ += weight * (std::isfinite(loss) ? loss : 0.0);
  if (batch > 0) {
    batch_sum_ += batch;
    ++batch_count_;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> RoundAccumulator::Aggregate(absl::Span<float> out) const {
  if (out.size() != size_) return absl::InvalidArgumentError("output size mismatch");
  if (count_ == 0) return false;
  if (streaming_) {
    for (size_t i = 0; i < size_; ++i) out[i] = static_cast<float>(sum_[i] / total_weight_);
    return true;
  }
  std::vector<ClientUpdate> updates;
  updates.reserve(kept_.size());
  for (const Kept& k : kept_) updates.push_back({k.values, k.weight});
  return rule_->Aggregate(updates, out).ok();
}

void RoundAccumulator::Reset() {
  if (streaming_) std::fill(sum_.begin(), sum_.end(), 0.0);
  kept_.clear();
  count_ = 0;
  total_weight_ = 0;
  loss_sum_ = 0;
  batch_sum_ = 0;
  batch_count_ = 0;
}

void RoundAccumulator::Save(internal::RoundState* state) const {
  state->set_count(count_);
  state->set_total_weight(total_weight_);
  state->set_loss_sum(loss_sum_);
  state->set_batch_sum(batch_sum_);
  state->set_batch_count(batch_count_);
  if (count_ == 0) return;
  if (streaming_) state->mutable_sum()->Add(sum_.begin(), sum_.end());
  for (const Kept& k : kept_) {
    internal::KeptUpdate* u = state->add_kept();
    u->set_client(k.client);
    u->set_weight(k.weight);
    u->mutable_values()->Add(k.values.begin(), k.values.end());
  }
}

absl::Status RoundAccumulator::Restore(const internal::RoundState& state) {
  Reset();
  if (state.count() == 0) return absl::OkStatus();
  if (!(state.total_weight() > 0)) return absl::DataLossError("the round's weight is not positive");
  if (streaming_) {
    if (static_cast<size_t>(state.sum_size()) != size_ || state.kept_size() != 0) {
      return absl::DataLossError("the round's sum does not match the model and rule");
    }
    sum_.assign(state.sum().begin(), state.sum().end());
  } else {
    if (static_cast<uint64_t>(state.kept_size()) != state.count() || state.sum_size() != 0) {
      return absl::DataLossError("the round's kept updates do not match the rule");
    }
    for (const internal::KeptUpdate& u : state.kept()) {
      if (static_cast<size_t>(u.values_size()) != size_ || !(u.weight() > 0)) {
        return absl::DataLossError("a kept update does not match the model");
      }
      kept_.push_back({u.client(), u.weight(), {u.values().begin(), u.values().end()}});
    }
  }
  count_ = state.count();
  total_weight_ = state.total_weight();
  loss_sum_ = state.loss_sum();
  batch_sum_ = state.batch_sum();
  batch_count_ = state.batch_count();
  return absl::OkStatus();
}

}  // namespace tern
