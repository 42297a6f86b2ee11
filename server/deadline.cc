#include "server/deadline.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tern {
namespace {

double Median(std::vector<double>& v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lo + hi);
}

}  // namespace

absl::Status CheckLearnedDeadline(const LearnedDeadlineOptions& o) {
  if (!(o.k >= 0) || !std::isfinite(o.k)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--learned_deadline_k=", o.k, ": spreads above the median, >= 0 (0: off)"));
  }
  if (o.floor <= absl::ZeroDuration() || o.floor > o.ceiling) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--deadline_floor_s=", absl::ToDoubleSeconds(o.floor),
        ": above 0 and at most --round_deadline_s=", absl::ToDoubleSeconds(o.ceiling)));
  }
  return absl::OkStatus();
}

void DeadlineLearner::Observe(absl::Duration offset) {
  if (!learning() || offset < absl::ZeroDuration()) return;
  offsets_.push_back(absl::ToDoubleSeconds(offset));
  while (offsets_.size() > std::max<size_t>(1, options_.window)) offsets_.pop_front();
}

void DeadlineLearner::Forget(absl::Duration offset) {
  if (!learning() || offset < absl::ZeroDuration()) return;
  const double x = absl::ToDoubleSeconds(offset);
  auto it = std::find(offsets_.rbegin(), offsets_.rend(), x);
  if (it != offsets_.rend()) offsets_.erase(std::next(it).base());
}

DeadlineLearner::Fit DeadlineLearner::Current() const {
  Fit f;
  f.samples = offsets_.size();
  if (offsets_.empty()) return f;
  std::vector<double> v(offsets_.begin(), offsets_.end());
  const double median = Median(v);
  for (double& x : v) x = std::fabs(x - median);
  f.median = absl::Seconds(median);
  f.spread = absl::Seconds(1.4826 * Median(v));
  return f;
}

absl::Duration DeadlineLearner::Deadline() const {
  if (!learning() || offsets_.size() < options_.min_samples) return options_.ceiling;
  const Fit f = Current();
  return std::clamp(f.median + options_.k * f.spread, options_.floor, options_.ceiling);
}

}  // namespace tern
