#include "worker/state_share.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crc32.h"
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

uint32_t GroupStateCrc(const GroupState& state) {
  uint32_t crc = Crc32(state.theta.data(), state.theta.size() * sizeof(float));
  crc = Crc32(state.momentum.data(), state.momentum.size() * sizeof(float), crc);
  for (const StepSchedule& s : state.schedules) {
    const int64_t both[2] = {s.period, s.from};
    crc = Crc32(both, sizeof(both), crc);
    if (s.fragments != 0) crc = Crc32(&s.fragments, sizeof(s.fragments), crc);
  }
  return crc;
}

SliceRange StateSliceRange(uint64_t n, uint32_t slice, uint32_t slices) {
  // n * i / slices without overflow for any n below 2^57 (a model's values are far fewer).
  return {.begin = n * slice / slices, .end = n * (slice + 1) / slices};
}

namespace {

absl::Status CheckSlice(uint32_t slice, uint32_t slices, uint64_t n) {
  if (slices < 1 || slices > kMaxStateSlices || slice >= slices ||
      slices > std::max<uint64_t>(n, 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice ", slice, " of ", slices, " of a state of ", n,
                     " values: there are 1 to ", kMaxStateSlices, " slices, at most one a value"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::TensorBundle> GroupStateToBundle(const PublishedState& published,
                                                    const std::string& run_id, int sender,
                                                    uint32_t slice, uint32_t slices) {
  const GroupState& state = published.state;
  const uint64_t n = state.theta.size();
  const bool momentum = !state.momentum.empty();
  if (momentum && state.momentum.size() != n) {
    return absl::InternalError(
        absl::StrCat("a momentum of ", state.momentum.size(), " values for a model of ", n));
  }
  TERN_RETURN_IF_ERROR(CheckSlice(slice, slices, n));
  const SliceRange range = StateSliceRange(n, slice, slices);
  const uint64_t len = range.end - range.begin;
  // Each part straight from its own vector: a state can be two copies of a large model, so it is
  // copied once, into the message.
  v1::TensorBundle bundle;
  for (ParamTensor part : StateLayout(len, momentum)) {
    const std::vector<float>& values = part.name == kTheta ? state.theta : state.momentum;
    part.offset = 0;
    TERN_RETURN_IF_ERROR(ExactTensor(part, absl::MakeConstSpan(values).subspan(range.begin, len),
                                     bundle.add_tensors()));
  }
  bundle.set_run_id(run_id);
  bundle.set_round(static_cast<uint64_t>(state.step));
  bundle.set_sender(absl::StrCat(sender));
  if (slices > 1) {
    bundle.set_bucket(slice);
    bundle.set_buckets(slices);
  }
  bundle.set_state_crc(published.crc);
  for (const StepSchedule& s : state.schedules) {
    v1::LocalStepsSchedule* out = bundle.add_schedules();
    out->set_period(static_cast<uint32_t>(s.period));
    out->set_from(s.from);
    out->set_fragments(static_cast<uint32_t>(s.fragments));
  }
  return bundle;
}

absl::StatusOr<StateSlice> StateSliceFromBundle(const v1::TensorBundle& bundle,
                                                const std::string& run_id, uint64_t num_params,
                                                uint32_t slice, uint32_t slices,
                                                const CodecRegistry& codecs) {
  if (bundle.run_id() != run_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("a state of run '", bundle.run_id(), "'; this worker is in '", run_id, "'"));
  }
  if (bundle.round() > (uint64_t{1} << 62)) {
    return absl::InvalidArgumentError(absl::StrCat("a state after step ", bundle.round()));
  }
  TERN_RETURN_IF_ERROR(CheckSlice(slice, slices, num_params));
  const uint32_t got_slices = std::max<uint32_t>(bundle.buckets(), 1);
  if (bundle.bucket() != (slices > 1 ? slice : 0) || got_slices != slices) {
    return absl::InvalidArgumentError(absl::StrCat("slice ", bundle.bucket(), " of ", got_slices,
                                                   " of a state, asked for slice ", slice, " of ",
                                                   slices));
  }
  const bool momentum = bundle.tensors_size() == 2;
  if (bundle.tensors_size() != 1 && !momentum) {
    return absl::InvalidArgumentError(absl::StrCat("a state of ", bundle.tensors_size(),
                                                   " parts; it has 'theta' and maybe 'momentum'"));
  }
  if (bundle.schedules_size() > kMaxStateSchedules) {
    return absl::InvalidArgumentError(absl::StrCat("a state of ", bundle.schedules_size(),
                                                   " schedules; at most ", kMaxStateSchedules));
  }
  std::vector<StepSchedule> schedules;
  for (const v1::LocalStepsSchedule& s : bundle.schedules()) {
    // A start more than a period's worth of steps from any step a run takes is no schedule.
    if (s.period() < 1 || s.period() > kMaxLocalSteps || s.from() > (int64_t{1} << 62) ||
        s.from() < -static_cast<int64_t>(kMaxLocalSteps) || s.fragments() > kMaxFragments) {
      return absl::InvalidArgumentError(absl::StrCat("a state's schedule of ", s.period(),
                                                     " steps per exchange from step ", s.from(),
                                                     " in ", s.fragments(), " fragments"));
    }
    schedules.push_back({.period = s.period(), .from = s.from(), .fragments = s.fragments()});
  }
  const SliceRange range = StateSliceRange(num_params, slice, slices);
  const uint64_t len = range.end - range.begin;
  std::vector<float> flat((momentum ? 2 : 1) * len);
  TERN_RETURN_IF_ERROR(
      BundleToFlat(bundle, StateLayout(len, momentum), codecs, absl::MakeSpan(flat)));
  if (!AllFinite(flat)) {
    return absl::InvalidArgumentError("a state holding Inf or NaN");
  }
  StateSlice out;
  out.step = static_cast<int64_t>(bundle.round());
  out.slice = slice;
  out.slices = slices;
  if (bundle.has_state_crc()) out.crc = bundle.state_crc();
  out.theta.assign(flat.begin(), flat.begin() + static_cast<ptrdiff_t>(len));
  out.momentum.assign(flat.begin() + static_cast<ptrdiff_t>(len), flat.end());
  out.schedules = std::move(schedules);
  return out;
}

absl::StatusOr<GroupState> JoinStateSlices(std::vector<StateSlice> slices, uint64_t num_params,
                                           bool one_state) {
  if (slices.empty()) return absl::InvalidArgumentError("a state of no slices");
  const uint32_t count = slices[0].slices;
  std::sort(slices.begin(), slices.end(),
            [](const StateSlice& a, const StateSlice& b) { return a.slice < b.slice; });
  const bool momentum = !slices[0].momentum.empty();
  GroupState state;
  for (uint32_t i = 0; i < slices.size(); ++i) {
    const StateSlice& s = slices[i];
    const SliceRange range = StateSliceRange(num_params, i, count);
    if (s.slices != count || s.slice != i || slices.size() != count ||
        s.theta.size() != range.end - range.begin ||
        s.momentum.size() != (momentum ? s.theta.size() : 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slices that do not make one state: slice ", s.slice, " of ", s.slices, " with ",
          s.theta.size(), " values", s.momentum.empty() ? "" : " and a momentum", " as slice ", i,
          " of ", count));
    }
    if (one_state && (!s.crc.has_value() || s.crc != slices[0].crc)) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", i, " is of another state than slice 0 (its CRC ",
                       s.crc.value_or(0), " against ", slices[0].crc.value_or(0), ")"));
    }
    if (s.schedules != slices[0].schedules) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", i, " says other exchange schedules than slice 0"));
    }
    state.step = std::max(state.step, s.step);
    state.theta.insert(state.theta.end(), s.theta.begin(), s.theta.end());
    state.momentum.insert(state.momentum.end(), s.momentum.begin(), s.momentum.end());
  }
  state.schedules = slices[0].schedules;
  if (one_state) {
    if (const uint32_t crc = GroupStateCrc(state); crc != *slices[0].crc) {
      return absl::DataLossError(absl::StrCat("the slices' values make a state of CRC ", crc,
                                              "; each said ", *slices[0].crc));
    }
  }
  return state;
}

namespace {
constexpr absl::string_view kAskAgain = "; ask again";
}  // namespace

bool StateNotYet(const absl::Status& s) {
  return absl::IsUnavailable(s) && absl::EndsWith(s.message(), kAskAgain);
}

std::optional<GroupMajority> MajorityElsewhere(int me, uint32_t mine,
                                               const std::map<int, uint32_t>& theirs) {
  struct Held {
    int count = 0;
    int lowest = std::numeric_limits<int>::max();
  };
  std::map<uint32_t, Held> held;
  const auto note = [&held](int worker, uint32_t crc) {
    Held& h = held[crc];
    ++h.count;
    h.lowest = std::min(h.lowest, worker);
  };
  note(me, mine);
  for (const auto& [worker, crc] : theirs) {
    if (worker != me) note(worker, crc);
  }
  uint32_t best = mine;
  for (const auto& [crc, h] : held) {
    const Held& b = held.at(best);
    if (h.count > b.count || (h.count == b.count && h.lowest < b.lowest)) best = crc;
  }
  if (best == mine) return std::nullopt;
  GroupMajority out;
  out.count = held.at(best).count;
  out.ours = held.at(mine).count;
  for (const auto& [worker, crc] : theirs) {
    if (crc == best && worker != me) out.holders.push_back(worker);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const PublishedState>> StateShare::Get(int64_t min_step) {
  absl::MutexLock lock(&mu_);
  if (published_ != nullptr && published_->state.step >= min_step) {
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

void StateShare::Publish(std::shared_ptr<const PublishedState> state) {
  absl::MutexLock lock(&mu_);
  if (wanted_.has_value() && state->state.step >= *wanted_) wanted_.reset();
  published_ = std::move(state);
}

}  // namespace tern
