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
// Thread-safety: thread-safe. The engine's step thread observes and decides; a metrics scrape
// reads Snapshot() from another thread.
#ifndef TERN_WORKER_STEPS_TUNER_H_
#define TERN_WORKER_STEPS_TUNER_H_

#include <cstdint>
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
};

// What the tuner measured and proposed (for metrics and logs).
struct StepsState {
  int64_t proposed = 0;        // the last window's proposal (0 before the first)
  double cu = 0;               // the last window's measured CU
  double compute_seconds = 0;  // its compute a step (wall time less waits)
  double push_seconds = 0;     // its mean push time of one update
  double need = 0;             // the H the target needs (smoothed), before rounding and range
};

class StepsTuner {
 public:
  // Refuses a range outside 1 <= min <= max <= kMaxLocalSteps and a target outside (0, 1).
  static absl::StatusOr<std::unique_ptr<StepsTuner>> Create(StepsTunerOptions options);

  // One step's wall time and the part of it spent waiting (for messages and pushes).
  void ObserveStep(double step_seconds, double wait_seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // One exchange whose pushes took `push_seconds` (the slowest peer's; 0: some push failed, not
  // measured).
  void ObserveExchange(double push_seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // After a full window: the H to propose (`current`, the group's, is where the first window
  // starts from). Starts a new window.
  std::optional<int64_t> Decide(int64_t current) ABSL_LOCKS_EXCLUDED(mu_);

  StepsState Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit StepsTuner(StepsTunerOptions options) : options_(options) {}

  const StepsTunerOptions options_;
  mutable absl::Mutex mu_;
  LinkWindow measured_ ABSL_GUARDED_BY(mu_);  // the window so far
  StepsState state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern

#endif  // TERN_WORKER_STEPS_TUNER_H_
