// The radius of self-centred clipping (ClippedGossip, He, Karimireddy & Jaggi 2022): a receiver
// mixes each neighbour's contribution z (its model minus the receiver's, or CHOCO's compressed
// difference) as min(1, radius / |z|) z, so that one neighbour, whatever it sends, moves the
// receiver by at most its weight × radius. The radius adapts to the run: `factor` × the lower
// median of the last `window` contributions' norms, each recorded as it was mixed (clipped to the
// radius then), so that a neighbour sending outsized contributions in at most half the rounds
// cannot raise it. Until `min_samples` norms were recorded, nothing is clipped (no basis to judge;
// the norm guard still applies). docs/robustness.md has the choice and what was measured.
//
// Thread-safety: not thread-safe; the owner (an algorithm, one thread) serializes calls.
#ifndef TERN_CORE_MODEL_CLIP_RADIUS_H_
#define TERN_CORE_MODEL_CLIP_RADIUS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/model/recent_norms.h"

namespace tern {

struct ClipRadiusOptions {
  // The radius is factor × the reference; 0 turns clipping off.
  double factor = 4;
  size_t window = 32;      // how many recent norms the reference is the lower median of
  size_t min_samples = 4;  // norms recorded before anything is clipped

  bool enabled() const { return factor > 0; }
};

class ClipRadius {
 public:
  explicit ClipRadius(ClipRadiusOptions options)
      : options_(options), recent_(std::max<size_t>(1, options.window)) {}

  // The scale in (0, 1] to mix a contribution of L2 norm `norm` with: 1 within the radius (and
  // while there is none), radius / norm past it. Records the norm as mixed. A non-finite norm
  // gets 0 and is not recorded (the codecs refuse non-finite values before this is asked).
  double Scale(double norm);
  // The current radius; 0 while there is none (nothing is clipped).
  double Radius() const;
  // Contributions scaled down so far.
  uint64_t clipped() const { return clipped_; }

 private:
  ClipRadiusOptions options_;
  RecentNorms recent_;
  uint64_t clipped_ = 0;
};

}  // namespace tern

#endif  // TERN_CORE_MODEL_CLIP_RADIUS_H_
