// Proposes diloco's H (steps between exchanges) from the link as measured, to keep compute
// utilization (CU: the share of a step's wall time not spent waiting for the link) at a target
// (--local_steps_min / --local_steps_max with --cu_target; docs/worker.md "Choosing H from the
// link"). An update's size does not depend on H, so an exchange costs the same whatever H is:
// over a period of H steps of c seconds each, P lanes (fragments) exchange once each, and an
// exchange whose pushes take p seconds, of which the overlap hides τ·c (--overlap_steps), leaves
// e = max(0, p − τ·c) waited: CU = H·c / (H·c + P·e) >= target needs
// H >= target / (1 − target) · P·e / c. And the link must carry a period's exchanges within the
// period's compute, or they queue behind each other: H >= P·p / c, counting a push's whole time
// as the link's (which errs long where the round trip, not the bytes, is most of it). Each window
// of exchanges measures c and p (the pushes' time to the last peer's acknowledgement, the link's
// cost alone: time spent waiting for a slower peer's compute is no reason to exchange less
// often) and proposes the least such H. A need above the last is taken at once; one below comes
// down by halves (the mean of the new window's and the last), and the proposal goes below its own
// last one only when that need is under ¾ of it, then with ¼ to spare, so a link at the edge
// does not flap.
// The proposal rides in this worker's updates; the group takes the largest (Diloco::Combine).
//
// With a range of fragment counts (min_fragments > 0), it proposes q, the turns the P lanes take
// a period, too: the lanes of a turn exchange at one step, so a turn's exchange carries P/q
// lanes' bytes and pays the round trip once. The exchange's time is modelled as
// p(q) = R + s·B/q (R: the round trip and fixed costs; s: seconds a byte; B: the whole update's
// bytes), fitted to the recent windows measured at each count (about the last four's mean; least
// squares, R and s at least 0).
// From one count alone R and s cannot be told apart: it is taken as all round trip (s = 0), which
// errs toward fewer turns, and the next window, at another count, gives the fit its second
// point. Over a period the waits are q·e(q), e(q) = max(0, p(q) − τ·c), and the link must carry
// the update's bytes, s·B, within the period's compute; each q's least H is
// max(target / (1 − target) · q·e(q), s·B, p(q)) / c, and the count with the least H is proposed
// (any H under the range's least counting as the least; the current count kept unless another
// needs a tenth less, and for 2, 4, ... 32 windows after each move but the first, so a count
// near a tie does not flap on noise): fewer turns where the round trip is what the overlap cannot
// hide, more where the bytes are.
//
// Thread-safety: thread-safe. The engine's step thread observes and decides; a metrics scrape
// reads Snapshot() from another thread.
#ifndef TERN_WORKER_STEPS_TUNER_H_
#define TERN_WORKER_STEPS_TUNER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/link_window.h"

namespace tern {

struct StepsTunerOptions {
  int64_t min_steps = 1;
  int64_t max_steps = 1;
  double cu_target = 0.9;
  int exchanges_per_window = 3;  // exchanges measured before each proposal
  int overlap_steps = 0;         // steps of compute an exchange overlaps (0: none)
  int lanes = 1;                 // lanes (fragments) exchanging once a period each
  // The least fragment count (turns a period) to propose; 0: the lanes' turns stay as they are.
  int min_fragments = 0;
};

// What the tuner measured and proposed (for metrics and logs).
struct StepsState {
  int64_t proposed = 0;        // the last window's proposal (0 before the first)
  double cu = 0;               // the last window's measured CU
  double compute_seconds = 0;  // its compute a step (wall time less waits)
  double push_seconds = 0;     // its mean push time of one update
  double need = 0;             // the H the target needs (smoothed), before rounding and range
  // With min_fragments: the fragment count proposed with H, and the link's model behind it.
  int64_t fragments = 0;
  double round_trip_seconds = 0;  // R
  double bytes_per_second = 0;    // 1 / s (0: not yet told apart from R)
};

class StepsTuner {
 public:
  // Refuses a range outside 1 <= min <= max <= kMaxLocalSteps and a target outside (0, 1).
  static absl::StatusOr<std::unique_ptr<StepsTuner>> Create(StepsTunerOptions options);

  // One step's wall time and the part of it spent waiting (for messages and pushes).
  void ObserveStep(double step_seconds, double wait_seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // One lane's exchange of `update_bytes` whose pushes took `push_seconds` (the slowest peer's;
  // 0: some push failed, not measured), while the lanes took `fragments` turns a period (0: not
  // moving).
  void ObserveExchange(double push_seconds, double update_bytes = 0, int64_t fragments = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // After a full window: the H to propose (`current`, the group's, is where the first window
  // starts from; with min_fragments, `current_fragments` is the group's count and the count to
  // propose is Snapshot().fragments). Starts a new window.
  std::optional<int64_t> Decide(int64_t current, int64_t current_fragments = 0)
      ABSL_LOCKS_EXCLUDED(mu_);

  StepsState Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One fragment count's recent windows (about the last four): a turn's bytes and its
  // exchanges' mean time.
  struct Point {
    double bytes = 0, seconds = 0;
    int windows = 0;
  };
  // A fragment count and the H it needs.
  struct Choice {
    int64_t fragments = 0;
    double need = 0;
  };

  explicit StepsTuner(StepsTunerOptions options) : options_(options) {}

  // The count whose H is least (the current one on a tie, or unless `may_move`) for steps of
  // `compute` s, from the points measured so far, and that H (before smoothing, rounding and
  // range); fills in the link's model in state_.
  Choice ChooseFragments(double compute, double update_bytes, int64_t current, bool may_move)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // H rounded up and within the range.
  int64_t InRange(double h) const;

  const StepsTunerOptions options_;
  mutable absl::Mutex mu_;
  LinkWindow measured_ ABSL_GUARDED_BY(mu_);  // the window so far
  // The count the window's exchanges were made at (0: none yet; -1: more than one).
  int64_t window_fragments_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, Point> points_ ABSL_GUARDED_BY(mu_);  // by fragment count
  int windows_at_count_ ABSL_GUARDED_BY(mu_) = 0;         // windows since the proposed count moved
  int count_hold_ ABSL_GUARDED_BY(mu_) = 1;               // windows a count is kept after a move
  int count_moves_ ABSL_GUARDED_BY(mu_) = 0;              // the proposed count's moves so far
  StepsState state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern

#endif  // TERN_WORKER_STEPS_TUNER_H_
