#include "worker/state_share.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/finite.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "core/model/layout.h"

namespace tern {
namespace {

constexpr char kTheta[] = "theta";
constexpr char kMomentum[] = "momentum";

// The flat vector's layout: θ, then the momentum when there is one.
std::vector<ParamTensor> StateLayout(uint64_t n, bool momentum) {
  std::vector<ParamTensor> layout = {{kTheta, {static_cast<int64_t>(n)}, 0, n}};
  if (momentum) layout.push_back({kMomentum, {static_cast<int64_t>(n)}, n, n});
  return layout;
}

}  // namespace

absl::StatusOr<v1::TensorBundle> GroupStateToBundle(const GroupState& state,
                                                    const std::string& run_id, int sender) {
  const uint64_t n = state.theta.size();
  const bool momentum = !state.momentum.empty();
  if (momentum && state.momentum.size() != n) {
    return absl::InternalError(
        absl::StrCat("a momentum of ", state.momentum.size(), " values for a model of ", n));
  }
  // Each part straight from its own vector (offset 0 in it): a state can be two copies of a
  // large model, so it is copied once, into the message.
  v1::TensorBundle bundle;
  for (ParamTensor part : StateLayout(n, momentum)) {
    const std::vector<float>& values = part.name == kTheta ? state.theta : state.momentum;
    part.offset = 0;
    TERN_RETURN_IF_ERROR(ExactTensor(part, values, bundle.add_tensors()));
  }
  bundle.set_run_id(run_id);
  bundle.set_round(static_cast<uint64_t>(state.step));
  bundle.set_sender(absl::StrCat(sender));
  return bundle;
}

absl::StatusOr<GroupState> GroupStateFromBundle(const v1::TensorBundle& bundle,
                                                const std::string& run_id, uint64_t num_params,
                                                const CodecRegistry& codecs) {
  if (bundle.run_id() != run_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("a state of run '", bundle.run_id(), "'; this worker is in '", run_id, "'"));
  }
  if (bundle.round() > (uint64_t{1} << 62)) {
    return absl::InvalidArgumentError(absl::StrCat("a state after step ", bundle.round()));
  }
  const bool momentum = bundle.tensors_size() == 2;
  if (bundle.tensors_size() != 1 && !momentum) {
    return absl::InvalidArgumentError(absl::StrCat("a state of ", bundle.tensors_size(),
                                                   " parts; it has 'theta' and maybe 'momentum'"));
  }
  std::vector<float> flat((momentum ? 2 : 1) * num_params);
  TERN_RETURN_IF_ERROR(
      BundleToFlat(bundle, StateLayout(num_params, momentum), codecs, absl::MakeSpan(flat)));
  if (!AllFinite(flat)) {
    return absl::InvalidArgumentError("a state holding Inf or NaN");
  }
  GroupState state;
  state.step = static_cast<int64_t>(bundle.round());
  state.theta.assign(flat.begin(), flat.begin() + static_cast<ptrdiff_t>(num_params));
  state.momentum.assign(flat.begin() + static_cast<ptrdiff_t>(num_params), flat.end());
  return state;
}

namespace {
constexpr absl::string_view kAskAgain = "; ask again";
}  // namespace

bool StateNotYet(const absl::Status& s) {
  return absl::IsUnavailable(s) && absl::EndsWith(s.message(), kAskAgain);
}

absl::StatusOr<std::shared_ptr<const v1::TensorBundle>> StateShare::Get(int64_t min_step) {
  absl::MutexLock lock(&mu_);
  if (published_ != nullptr && static_cast<int64_t>(published_->round()) >= min_step) {
    return published_;
  }
  wanted_ = wanted_.has_value() ? std::min(*wanted_, min_step) : min_step;
  return absl::UnavailableError(absl::StrCat(
      "no state after step ", min_step, " or later yet: it comes at the end of the first such ",
      "step with no exchange in flight", kAskAgain));
}

bool StateShare::Wanted(int64_t step) const {
  absl::MutexLock lock(&mu_);
  return wanted_.has_value() && step >= *wanted_;
}

void StateShare::Publish(std::shared_ptr<const v1::TensorBundle> bundle) {
  absl::MutexLock lock(&mu_);
  if (wanted_.has_value() && static_cast<int64_t>(bundle->round()) >= *wanted_) wanted_.reset();
  published_ = std::move(bundle);
}

}  // namespace tern
