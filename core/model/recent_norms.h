// The last few norms an owner recorded and their median: the reference of the norm guard
// (core/model/norm_guard.h) and of the clipping radius (core/model/clip_radius.h).
//
// Thread-safety: not thread-safe; the owner serializes calls.
#ifndef TERN_CORE_MODEL_RECENT_NORMS_H_
#define TERN_CORE_MODEL_RECENT_NORMS_H_

#include <algorithm>
#include <cstddef>
#include <deque>
#include <vector>

namespace tern {

class RecentNorms {
 public:
  // Keeps the last `window` norms (0: none).
  explicit RecentNorms(size_t window) : window_(window) {}

  void Add(double norm) {
    if (window_ == 0) return;
    recent_.push_back(norm);
    while (recent_.size() > window_) recent_.pop_front();
  }
  size_t size() const { return recent_.size(); }
  // Every norm kept times `f`: what they would have been over a span f times as long.
  void Scale(double f) {
    for (double& n : recent_) n *= f;
  }
  // The norm of rank `size() / 2` among those kept (the median; the upper one of an even count),
  // or with `lower`, of rank `(size() - 1) / 2`; 0 when none is kept.
  double Median(bool lower = false) const {
    if (recent_.empty()) return 0;
    std::vector<double> v(recent_.begin(), recent_.end());
    const size_t mid = lower ? (v.size() - 1) / 2 : v.size() / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
    return v[mid];
  }

 private:
  size_t window_;
  std::deque<double> recent_;
};

}  // namespace tern

#endif  // TERN_CORE_MODEL_RECENT_NORMS_H_
