#include "server/server_step.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/finite.h"
#include "common/status_macros.h"
#include "core/federated/protocol.h"
#include "spdlog/spdlog.h"

namespace tern {
namespace {

void WarnSkipped(int64_t round) {
  spdlog::warn("server: round {}: the step would overflow the model; skipped", round);
}

// Rounds count from 1; a schedule's steps from 0.
double RoundScale(const LrSchedule& lr, int64_t round) {
  return lr.Scale(std::max<int64_t>(0, round - 1));
}

}  // namespace

void OuterServerStep::Reset(const std::vector<ParamTensor>& layout) {
  numel_ = LayoutNumel(layout);
  outer_->Reset(numel_);
}

absl::Status OuterServerStep::Close(const std::vector<float>* mean, int64_t round,
                                    std::vector<float>* model, Downstream* downstream) {
  // No update: a zero step, which still flushes a delta downstream's residual; the momentum
  // waits for the next update.
  std::vector<float> step(numel_, 0.0f);
  if (mean != nullptr) outer_->Step(*mean, absl::MakeSpan(step));
  if (const float scale = static_cast<float>(RoundScale(lr_, round)); scale != 1.0f) {
    for (float& v : step) v *= scale;
  }
  TERN_ASSIGN_OR_RETURN(bool applied, downstream->Apply(step, round, model));
  if (!applied) {
    WarnSkipped(round);
    outer_->Forget();
  }
  return absl::OkStatus();
}

void OuterServerStep::Save(internal::ServerOptimizerState* state) const {
  absl::Span<const float> m = outer_->momentum();
  state->mutable_momentum()->Add(m.begin(), m.end());
}

absl::Status OuterServerStep::Restore(const internal::ServerOptimizerState& state, int64_t) {
  return outer_->Restore(absl::MakeConstSpan(state.momentum().data(), state.momentum_size()));
}

AdamServerStep::AdamServerStep(AdamSettings settings, int64_t warmup_rounds, DeltaDownstream* delta,
                               LrSchedule lr)
    : settings_(settings), warmup_rounds_(warmup_rounds), lr_(lr), delta_(delta) {}

void AdamServerStep::Reset(const std::vector<ParamTensor>& layout) {
  layout_ = layout;
  state_.Reset(LayoutNumel(layout), layout.size());
}

absl::Status AdamServerStep::Close(const std::vector<float>* mean, int64_t round,
                                   std::vector<float>* model, Downstream* downstream) {
  if (mean != nullptr && Compressed(round)) return CompressedClose(*mean, round, model);
  if (mean != nullptr) TERN_RETURN_IF_ERROR(DenseClose(*mean, round, model, downstream));
  // The warm-up's last round freezes the variance, even when no update came or the step was
  // skipped.
  if (onebit() && round == warmup_rounds_) FreezeVariance(settings_, &state_);
  return absl::OkStatus();
}

absl::Status AdamServerStep::DenseClose(const std::vector<float>& mean, int64_t round,
                                        std::vector<float>* model, Downstream* downstream) {
  AdamState saved = state_;  // an overflowing step leaves the optimizer as it was too
  std::vector<float> step(model->size());
  AdamSettings settings = settings_;
  settings.lr = static_cast<float>(settings.lr * RoundScale(lr_, round));
  AdamStep(settings, layout_, *model, mean, &state_, absl::MakeSpan(step));
  bool finite = AllFinite(step);
  for (size_t i = 0; i < step.size() && finite; ++i) finite = std::isfinite((*model)[i] + step[i]);
  if (!finite) {
    WarnSkipped(round);
    state_ = std::move(saved);
    return absl::OkStatus();
  }
  if (!onebit()) {
    TERN_ASSIGN_OR_RETURN(bool applied, downstream->Apply(step, round, model));
    if (!applied) WarnSkipped(round);
    return absl::OkStatus();
  }
  // 1-bit warm-up: the exact model goes down (no kept updates).
  for (size_t i = 0; i < step.size(); ++i) (*model)[i] += step[i];
  return absl::OkStatus();
}

absl::Status AdamServerStep::CompressedClose(const std::vector<float>& mean, int64_t round,
                                             std::vector<float>* model) {
  // `mean` is the clients' mean momentum: re-encode it with the server's error feedback; the
  // momentum becomes what clients decode, and everyone steps with the frozen variance.
  TERN_ASSIGN_OR_RETURN(DeltaDownstream::Encoded e, delta_->Encode(mean, round));
  std::vector<float> x = *model;
  for (size_t l = 0; l < layout_.size(); ++l) {
    const ParamTensor& p = layout_[l];
    FrozenAdamStep(settings_.lr, state_.ratio[l], settings_.eps,
                   absl::MakeConstSpan(e.decoded).subspan(p.offset, p.numel),
                   absl::MakeConstSpan(state_.v).subspan(p.offset, p.numel),
                   absl::MakeSpan(x).subspan(p.offset, p.numel));
  }
  if (!AllFinite(x)) {
    WarnSkipped(round);
    return absl::OkStatus();
  }
  *model = std::move(x);
  state_.m = e.decoded;
  delta_->Keep(std::move(e), round);
  return absl::OkStatus();
}

void AdamServerStep::AdjustTask(int64_t round, v1::Task* task) const {
  if (!onebit()) return;
  if (Compressed(round)) {
    task->set_error_feedback(true);
  } else {  // warm-up: dense gradients
    task->set_update_codec("none");
    task->set_error_feedback(false);
  }
}

absl::Status AdamServerStep::AppendState(int64_t round, v1::TensorBundle* b) const {
  if (!Compressed(round)) return absl::OkStatus();
  return AppendOptimizerState(layout_, state_, b);
}

void AdamServerStep::Save(internal::ServerOptimizerState* state) const {
  state->mutable_momentum()->Add(state_.m.begin(), state_.m.end());
  state->mutable_adam_v()->Add(state_.v.begin(), state_.v.end());
  state->mutable_trust_ratio()->Add(state_.ratio.begin(), state_.ratio.end());
}

absl::Status AdamServerStep::Restore(const internal::ServerOptimizerState& state,
                                     int64_t rounds_closed) {
  const size_t d = state_.v.size();
  if (static_cast<size_t>(state.momentum_size()) != d ||
      static_cast<size_t>(state.adam_v_size()) != d ||
      static_cast<size_t>(state.trust_ratio_size()) != layout_.size()) {
    return absl::DataLossError("the Adam state does not match the model");
  }
  state_.m.assign(state.momentum().begin(), state.momentum().end());
  state_.v.assign(state.adam_v().begin(), state.adam_v().end());
  state_.ratio.assign(state.trust_ratio().begin(), state.trust_ratio().end());
  state_.steps = onebit() ? std::min(rounds_closed, warmup_rounds_) : rounds_closed;
  return absl::OkStatus();
}

}  // namespace tern
