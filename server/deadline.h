// A round's deadline learned from when replies arrive (ALGORITHMS.md §4, "deadlines that learn";
// hivemind #676): the median of the recent arrival offsets (time from a round's opening to a
// reply) plus k times their spread, the median absolute deviation scaled by 1.4826 (so k counts
// standard deviations of a normal spread), within [floor, ceiling]. Until `min_samples` arrivals
// were seen, the ceiling (the fixed --round_deadline_s) holds.
//
// Thread-safety: thread-compatible; the round tracker owns one under the aggregator's mutex.
#ifndef TERN_SERVER_DEADLINE_H_
#define TERN_SERVER_DEADLINE_H_

#include <cstddef>
#include <deque>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tern {

struct LearnedDeadlineOptions {
  double k = 0;  // 0: off, the ceiling always
  absl::Duration floor = absl::Seconds(1);
  absl::Duration ceiling = absl::Seconds(60);
  size_t window = 256;     // the most recent arrivals kept
  size_t min_samples = 8;  // arrivals before the learned deadline replaces the ceiling
};

// InvalidArgument naming the flag for k < 0 or not finite, a floor <= 0 or above the ceiling.
absl::Status CheckLearnedDeadline(const LearnedDeadlineOptions& o);

class DeadlineLearner {
 public:
  explicit DeadlineLearner(LearnedDeadlineOptions options) : options_(options) {}

  // A reply that arrived `offset` after its round opened (negative ones are ignored).
  void Observe(absl::Duration offset);
  // Takes back the newest sample Observe(offset) kept (a reply that was not kept after all);
  // nothing if none is kept.
  void Forget(absl::Duration offset);
  // The deadline a round opening now gets.
  absl::Duration Deadline() const;

  // What the last Deadline() was made of (for the log): the median and scaled MAD of the
  // arrivals kept, and how many.
  struct Fit {
    absl::Duration median = absl::ZeroDuration();
    absl::Duration spread = absl::ZeroDuration();
    size_t samples = 0;
  };
  Fit Current() const;
  bool learning() const { return options_.k > 0; }

 private:
  LearnedDeadlineOptions options_;
  std::deque<double> offsets_;  // seconds, oldest first
};

}  // namespace tern

#endif  // TERN_SERVER_DEADLINE_H_
