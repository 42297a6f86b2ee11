#include "core/model/norm_guard.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tern {

void NormGuard::Observe(double norm) {
  if (std::isfinite(norm)) recent_.Add(norm);
}

double NormGuard::Reference() const { return recent_.Median(); }

absl::Status NormGuard::Check(double norm, const std::string& what) const {
  if (!std::isfinite(norm)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has a non-finite norm"));
  }
  if (!enabled() || recent_.size() < std::max<size_t>(1, options_.min_samples)) {
    return absl::OkStatus();
  }
  const double reference = Reference();
  if (reference <= 0 || norm <= options_.factor * reference) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " has norm ", norm, ", over ", options_.factor, "x the recent median ", reference, " (",
      options_.flag, "=", options_.factor, "; ", options_.flag, "=0 turns the guard off)"));
}

}  // namespace tern
