// A guard against well-formed but harmful tensors: a message or update whose L2 norm is far
// above what was recently seen (a neighbour's model scaled by 1e30, one client's update blown
// up) is refused before it changes anything. The reference is the median of the last few norms
// the owner vouches for: its own outgoing gossip messages in a worker, the accepted updates in an
// aggregator. Until `min_samples` norms were observed, or while the reference is 0, everything
// passes (no basis to judge). docs/robustness.md has the defaults and what was measured.
//
// Thread-safety: not thread-safe; the owner serializes calls (worker and aggregator keep it under
// their own lock).
#ifndef TERN_CORE_MODEL_NORM_GUARD_H_
#define TERN_CORE_MODEL_NORM_GUARD_H_

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "core/model/recent_norms.h"

namespace tern {

struct NormGuardOptions {
  // Refuse norms above factor × the reference; 0 turns the guard off.
  double factor = 10;
  size_t window = 32;                 // how many recent norms the reference is the median of
  size_t min_samples = 3;             // norms observed before the guard judges
  std::string flag = "--norm_guard";  // named in refusals, so an operator knows the knob

  bool enabled() const { return factor > 0; }
};

class NormGuard {
 public:
  explicit NormGuard(NormGuardOptions options)
      : options_(std::move(options)), recent_(options_.window) {}

  // Records a trusted norm (own message, accepted update).
  void Observe(double norm);
  // The reference times `f` (diloco's updates when H moves f times as long: an update over f
  // times the steps is at most f times the norm, by the triangle inequality).
  void Scale(double f) { recent_.Scale(f); }
  // OK, or InvalidArgument naming the norm, the bound and the flag. `what` starts the message.
  absl::Status Check(double norm, const std::string& what) const;
  // The median of the window (0 when empty).
  double Reference() const;
  bool enabled() const { return options_.enabled(); }

 private:
  NormGuardOptions options_;
  RecentNorms recent_;
};

}  // namespace tern

#endif  // TERN_CORE_MODEL_NORM_GUARD_H_
