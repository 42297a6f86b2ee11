#include "core/model/clip_radius.h"

#include <algorithm>
#include <cmath>

namespace tern {

double ClipRadius::Radius() const {
  if (!options_.enabled() || recent_.size() < std::max<size_t>(1, options_.min_samples)) return 0;
  // The lower median: with half the window outsized (one of two neighbours, every round), the
  // reference is still an honest one.
  return options_.factor * recent_.Median(/*lower=*/true);
}

double ClipRadius::Scale(double norm) {
  if (!std::isfinite(norm)) return 0;
  if (!options_.enabled()) return 1;
  const double radius = Radius();
  double scale = 1;
  if (radius > 0 && norm > radius) {
    scale = radius / norm;
    ++clipped_;
  }
  recent_.Add(norm * scale);
  return scale;
}

}  // namespace tern
