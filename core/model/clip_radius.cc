#include "core/model/clip_radius.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tern {

double ClipRadius::Radius() const {
  if (!options_.enabled() || recent_.size() < std::max<size_t>(1, options_.min_samples)) return 0;
  std::vector<double> v(recent_.begin(), recent_.end());
  // The lower median: with half the window outsized (one of two neighbours, every round), the
  // reference is still an honest one.
  const size_t mid = (v.size() - 1) / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return options_.factor * v[mid];
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
  recent_.push_back(norm * scale);
  while (recent_.size() > std::max<size_t>(1, options_.window)) recent_.pop_front();
  return scale;
}

}  // namespace tern
