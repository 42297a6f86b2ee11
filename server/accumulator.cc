#include "server/accumulator.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tern {

RoundAccumulator::RoundAccumulator(const AggregationRule* rule, size_t size)
    : rule_(rule), streaming_(rule->Spec() == "fedavg"), size_(size) {
  if (!streaming_) return;
  stripes_ = std::make_unique<Stripe[]>(kStripes);
  for (size_t i = 0; i < kStripes; ++i) {
    Stripe& st = stripes_[i];
    st.begin = size_ * i / kStripes;
    absl::MutexLock lock(&st.mu);
    st.sum.assign(size_ * (i + 1) / kStripes - st.begin, 0.0);
  }
}

absl::Status RoundAccumulator::Check(absl::Span<const float> update, double weight) const {
  if (!(weight > 0) || !std::isfinite(weight)) {
    return absl::InvalidArgumentError(absl::StrCat("weight must be positive, got ", weight));
  }
  if (update.size() != size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("update of ", update.size(), " values for a model of ", size_));
  }
  return absl::OkStatus();
}

absl::Status RoundAccumulator::Add(uint32_t client, absl::Span<const float> update, double weight,
                                   double loss, uint32_t batch) {
  Reserve();
  return AddReserved(client, update, weight, loss, batch);
}

void RoundAccumulator::Reserve() {
  absl::MutexLock lock(&mu_);
  ++pending_;
}

void RoundAccumulator::CancelReserved() {
  absl::MutexLock lock(&mu_);
  --pending_;
}

absl::Status RoundAccumulator::AddReserved(uint32_t client, absl::Span<const float> update,
                                           double weight, double loss, uint32_t batch) {
  absl::Status s = Check(update, weight);
  std::vector<float> copy;
  if (s.ok() && streaming_) {
    for (size_t i = 0; i < kStripes; ++i) {
      Stripe& st = stripes_[i];
      absl::MutexLock lock(&st.mu);
      const float* u = update.data() + st.begin;
      for (size_t j = 0; j < st.sum.size(); ++j) st.sum[j] += weight * u[j];
    }
  } else if (s.ok()) {
    copy.assign(update.begin(), update.end());  // outside mu_
  }
  absl::MutexLock lock(&mu_);
  --pending_;
  if (!s.ok()) return s;
  if (!streaming_) kept_.push_back({client, weight, std::move(copy)});
  ++count_;
  total_weight_ += weight;
  loss_sum_ += weight * (std::isfinite(loss) ? loss : 0.0);
  if (batch > 0) {
    batch_sum_ += batch;
    ++batch_count_;
  }
  return absl::OkStatus();
}

void RoundAccumulator::AwaitIdle() const {
  mu_.Await(absl::Condition(
      +[](const int* pending) { return *pending == 0; }, &pending_));
}

size_t RoundAccumulator::count() const {
  absl::MutexLock lock(&mu_);
  AwaitIdle();
  return count_;
}

double RoundAccumulator::mean_loss() const {
  absl::MutexLock lock(&mu_);
  AwaitIdle();
  return total_weight_ > 0 ? loss_sum_ / total_weight_ : 0.0;
}

double RoundAccumulator::total_weight() const {
  absl::MutexLock lock(&mu_);
  AwaitIdle();
  return total_weight_;
}

double RoundAccumulator::mean_batch() const {
  absl::MutexLock lock(&mu_);
  AwaitIdle();
  return batch_count_ > 0 ? batch_sum_ / static_cast<double>(batch_count_) : 0.0;
}

std::vector<double> RoundAccumulator::GatherSum() const {
  std::vector<double> sum;
  sum.reserve(size_);
  for (size_t i = 0; i < kStripes; ++i) {
    Stripe& st = stripes_[i];
    absl::MutexLock lock(&st.mu);
    sum.insert(sum.end(), st.sum.begin(), st.sum.end());
  }
  return sum;
}

void RoundAccumulator::ScatterSum(const std::vector<double>& sum) {
  for (size_t i = 0; i < kStripes; ++i) {
    Stripe& st = stripes_[i];
    absl::MutexLock lock(&st.mu);
    std::copy_n(sum.begin() + static_cast<ptrdiff_t>(st.begin), st.sum.size(), st.sum.begin());
  }
}

absl::StatusOr<bool> RoundAccumulator::Aggregate(absl::Span<float> out) const {
  if (out.size() != size_) return absl::InvalidArgumentError("output size mismatch");
  absl::MutexLock lock(&mu_);
  AwaitIdle();
  if (count_ == 0) return false;
  if (streaming_) {
    const std::vector<double> sum = GatherSum();
    for (size_t i = 0; i < size_; ++i) out[i] = static_cast<float>(sum[i] / total_weight_);
    return true;
  }
  std::vector<ClientUpdate> updates;
  updates.reserve(kept_.size());
  for (const Kept& k : kept_) updates.push_back({k.values, k.weight});
  return rule_->Aggregate(updates, out).ok();
}

void RoundAccumulator::Reset() {
  absl::MutexLock lock(&mu_);
  AwaitIdle();
  ResetLocked();
}

void RoundAccumulator::ResetLocked() {
  if (streaming_) ScatterSum(std::vector<double>(size_, 0.0));
  kept_.clear();
  count_ = 0;
  total_weight_ = 0;
  loss_sum_ = 0;
  batch_sum_ = 0;
  batch_count_ = 0;
}

void RoundAccumulator::Save(internal::RoundState* state) const {
  absl::MutexLock lock(&mu_);
  AwaitIdle();
  state->set_count(count_);
  state->set_total_weight(total_weight_);
  state->set_loss_sum(loss_sum_);
  state->set_batch_sum(batch_sum_);
  state->set_batch_count(batch_count_);
  if (count_ == 0) return;
  if (streaming_) {
    const std::vector<double> sum = GatherSum();
    state->mutable_sum()->Add(sum.begin(), sum.end());
  }
  for (const Kept& k : kept_) {
    internal::KeptUpdate* u = state->add_kept();
    u->set_client(k.client);
    u->set_weight(k.weight);
    u->mutable_values()->Add(k.values.begin(), k.values.end());
  }
}

absl::Status RoundAccumulator::Restore(const internal::RoundState& state) {
  absl::MutexLock lock(&mu_);
  AwaitIdle();
  ResetLocked();
  if (state.count() == 0) return absl::OkStatus();
  if (!(state.total_weight() > 0)) return absl::DataLossError("the round's weight is not positive");
  if (streaming_) {
    if (static_cast<size_t>(state.sum_size()) != size_ || state.kept_size() != 0) {
      return absl::DataLossError("the round's sum does not match the model and rule");
    }
    ScatterSum(std::vector<double>(state.sum().begin(), state.sum().end()));
  } else {
    if (static_cast<uint64_t>(state.kept_size()) != state.count() || state.sum_size() != 0) {
      return absl::DataLossError("the round's kept updates do not match the rule");
    }
    for (const internal::KeptUpdate& u : state.kept()) {
      if (static_cast<size_t>(u.values_size()) != size_ || !(u.weight() > 0)) {
        ResetLocked();
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
