#include "worker/steps_tuner.h"

#include <algorithm>
#include <cmath>

#include "absl/memory/memory.h"
#include "absl/strings/str_format.h"
#include "worker/step_schedule.h"

namespace tern {
namespace {

// The least H that keeps CU at the target over steps of `compute` s, when each of a period's `q`
// turns takes `p` s to push (the overlap hides options.overlap_steps steps of it) and the link
// needs `link` s a period for the bytes; at least one push a period.
double LeastSteps(const StepsTunerOptions& options, double compute, double p, double link,
                  int64_t q) {
  const double target = options.cu_target;
  const double exposed = std::max(0.0, p - options.overlap_steps * compute);
  return std::max({target / (1 - target) * static_cast<double>(q) * exposed, link, p}) / compute;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepsTuner>> StepsTuner::Create(StepsTunerOptions options) {
  if (options.min_steps < 1 || options.min_steps > options.max_steps ||
      options.max_steps > static_cast<int64_t>(kMaxLocalSteps)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--local_steps_min=%d, --local_steps_max=%d: a range within [1, %d]",
                        options.min_steps, options.max_steps, kMaxLocalSteps));
  }
  if (options.min_fragments < 0 ||
      (options.min_fragments > 0 && (options.lanes < 2 || options.min_fragments > options.lanes))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--fragments_min=%d: within [1, --fragments=%d], with --fragments > 1",
                        options.min_fragments, options.lanes));
  }
  if (!(options.cu_target > 0 && options.cu_target < 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--cu_target=%g: a share of the step's time, in (0, 1)", options.cu_target));
  }
  return absl::WrapUnique(new StepsTuner(options));
}

void StepsTuner::ObserveStep(double step_seconds, double wait_seconds) {
  absl::MutexLock lock(&mu_);
  measured_.AddStep(step_seconds, wait_seconds);
}

void StepsTuner::ObserveExchange(double push_seconds, double update_bytes, int64_t fragments) {
  absl::MutexLock lock(&mu_);
  measured_.AddExchange(update_bytes, push_seconds);
  if (window_fragments_ == 0) {
    window_fragments_ = fragments;
  } else if (window_fragments_ != fragments) {
    window_fragments_ = -1;
  }
}

int64_t StepsTuner::InRange(double h) const {
  // Less a hair: 9 × 0.2 / 0.1 is 18.000000000000004 in doubles.
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(std::min(h, 1e9) - 1e-9)),
                             options_.min_steps, options_.max_steps);
}

StepsTuner::Choice StepsTuner::ChooseFragments(double compute, double update_bytes, int64_t current,
                                               bool may_move) {
  // p(q) = R + s·B/q through the points (a turn's bytes, its exchanges' time).
  double r = state_.push_seconds, s = 0;
  // The link's time a period: s·B once R and s are told apart; until then a period's turns'
  // whole time, as without a range of counts.
  double link = static_cast<double>(current) * r;
  if (points_.size() >= 2) {
    double mx = 0, my = 0;
    for (const auto& [q, p] : points_) {
      mx += p.bytes;
      my += p.seconds;
    }
    mx /= static_cast<double>(points_.size());
    my /= static_cast<double>(points_.size());
    double sxx = 0, sxy = 0, xx = 0, xy = 0;
    for (const auto& [q, p] : points_) {
      sxx += (p.bytes - mx) * (p.bytes - mx);
      sxy += (p.bytes - mx) * (p.seconds - my);
      xx += p.bytes * p.bytes;
      xy += p.bytes * p.seconds;
    }
    s = sxx > 0 ? sxy / sxx : 0;
    r = my - s * mx;
    if (s < 0) {  // more bytes no slower: all fixed cost
      s = 0;
      r = my;
    } else if (r < 0) {  // through the origin: all bytes
      r = 0;
      s = xx > 0 ? xy / xx : 0;
    }
    link = s * update_bytes;
  } else if (points_.size() == 1) {
    r = points_.begin()->second.seconds;  // all round trip, until a second count is measured
    link = static_cast<double>(points_.begin()->first) * r;
  }
  state_.round_trip_seconds = r;
  state_.bytes_per_second = s > 0 ? 1 / s : 0;
  const auto need = [&](int64_t q) {
    return LeastSteps(options_, compute, r + s * update_bytes / static_cast<double>(q), link, q);
  };
  // Counts compare by the H they need, any H under the range's least as the least (nothing to
  // gain there) but one over its most as itself (the range caps H, not the waits); the best
  // replaces the current count only when a tenth or more better, so counts near a tie do not
  // flap (each move realigns the turns: a round of half a period to one and a half).
  const auto score = [&](double h) { return std::max(static_cast<double>(options_.min_steps), h); };
  const double at_current = need(current);
  Choice best{.fragments = current, .need = at_current};
  if (!may_move) return best;
  for (int64_t q = std::max(1, options_.lanes); q >= options_.min_fragments; --q) {
    const double h = need(q);
    if (score(h) < score(best.need)) best = {.fragments = q, .need = h};
  }
  if (score(best.need) <= 0.9 * score(at_current)) return best;
  return {.fragments = current, .need = at_current};
}

std::optional<int64_t> StepsTuner::Decide(int64_t current, int64_t current_fragments) {
  absl::MutexLock lock(&mu_);
  if (!measured_.Full(std::max(1, options_.exchanges_per_window))) return std::nullopt;
  const LinkWindow w = measured_;
  const int64_t measured_at = window_fragments_;
  measured_ = LinkWindow();
  window_fragments_ = 0;
  const double compute = w.compute();
  state_.cu = w.cu();
  state_.compute_seconds = compute;
  state_.push_seconds = w.push();
  if (w.exchanges == 0 || compute <= 0) return std::nullopt;
  double need = 0;
  if (options_.min_fragments > 0) {
    const int64_t lanes = std::max(1, options_.lanes);
    // Kept on a tie: its own last proposal, as H's band is (the group's may lag behind it).
    const int64_t last = state_.fragments > 0    ? state_.fragments
                         : current_fragments > 0 ? current_fragments
                                                 : lanes;
    const int64_t now = std::clamp<int64_t>(last, options_.min_fragments, lanes);
    // A window measured at one count is that count's point: a turn carries lanes / q lanes.
    const double update_bytes = w.update_bytes() * static_cast<double>(lanes);
    if (measured_at > 0 && update_bytes > 0) {
      // The mean of about the last four windows at that count: one window's pushes swing by
      // half on a busy link, and the fit would follow them.
      Point& p = points_[measured_at];
      p.windows = std::min(p.windows + 1, 4);
      const double weight = 1.0 / p.windows;
      p.bytes += weight * (update_bytes / static_cast<double>(measured_at) - p.bytes);
      p.seconds += weight * (state_.push_seconds - p.seconds);
    }
    // A count held since its move for fewer windows than the hold keeps its place; each move
    // after the first (which may be the one-point guess's probe) doubles the hold (2, 4, ... 32
    // windows), so counts near a tie do not flap on noise.
    ++windows_at_count_;
    const Choice choice =
        ChooseFragments(compute, update_bytes, now, windows_at_count_ >= count_hold_);
    if (choice.fragments != now) {
      windows_at_count_ = 0;
      ++count_moves_;
      count_hold_ = count_moves_ < 2 ? 1 : 1 << std::min(count_moves_ - 1, 5);
    }
    state_.fragments = choice.fragments;
    need = choice.need;
  } else {
    // Every lane its own turn, each turn's push all round trip.
    const int64_t lanes = std::max(1, options_.lanes);
    need = LeastSteps(options_, compute, state_.push_seconds,
                      static_cast<double>(lanes) * state_.push_seconds, lanes);
  }
  // A slower link is taken at once; a faster one by halves, window after window, so one quick
  // window does not undo a long period.
  state_.need = state_.need > 0 && need < state_.need ? 0.5 * (need + state_.need) : need;
  // Measured against its own last proposal, not the group's H of the moment (a lane may not
  // have moved yet), so a need that wavers inside the band does not flap.
  int64_t proposal = std::clamp<int64_t>(state_.proposed > 0 ? state_.proposed : current,
                                         options_.min_steps, options_.max_steps);
  if (state_.need > static_cast<double>(proposal)) {
    proposal = InRange(state_.need);
  } else if (4 * state_.need <= 3 * static_cast<double>(proposal)) {
    proposal = std::min(proposal, InRange(1.25 * state_.need));
  }
  state_.proposed = proposal;
  return proposal;
}

StepsState StepsTuner::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

}  // namespace tern
