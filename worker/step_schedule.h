// diloco's exchange schedule, which the group may move during a run (--local_steps_max,
// --fragments_min) and a joiner takes with the group's state.
//
// Thread-safety: a plain value.
#ifndef TERN_WORKER_STEP_SCHEDULE_H_
#define TERN_WORKER_STEP_SCHEDULE_H_

#include <algorithm>
#include <cstdint>

namespace tern {

// The most steps between exchanges diloco's H may take (TensorBundle.propose_local_steps).
inline constexpr uint32_t kMaxLocalSteps = 1 << 20;
// The most fragments a model is cut into (--fragments; TensorBundle.propose_fragments).
inline constexpr uint32_t kMaxFragments = 1024;

// A lane exchanges at step s when s >= from and (s + 1 - from) is a multiple of period
// (TensorBundle.schedules). With --fragments_min, `fragments` is the number of turns the lanes
// take a period (lane k in turn k mod fragments, the lanes of a turn exchanging at one step);
// otherwise 0.
struct StepSchedule {
  int64_t period = 1;
  int64_t from = 0;
  int64_t fragments = 0;
  bool operator==(const StepSchedule&) const = default;
};

// Lane `lane`'s schedule when the lanes take `fragments` turns a period of `period` steps, turn t
// period·t/fragments steps before turn 0, as the run's first schedule staggers them; its first
// exchange is the step of its turn nearest a period after `after` (the step after the lane's last
// exchange; a tie goes to the earlier), so the round between is half a period to one and a half.
// Every lane that moves to the same (period, fragments) lands in step with the others, whenever
// it moves.
inline StepSchedule AlignedSchedule(int64_t period, int64_t fragments, int64_t lane,
                                    int64_t after) {
  const int64_t h = std::max<int64_t>(1, period);
  const int64_t q = std::max<int64_t>(1, fragments);
  const int64_t offset = h * (lane % q) / q;
  // The lane's turns are the steps s with (s + 1 + offset) ≡ 0 (mod h).
  const int64_t target = after + h - 1;
  const int64_t below = target - ((target + 1 + offset) % h + h) % h;
  const int64_t first = 2 * (target - below) <= h ? below : below + h;
  return {.period = h, .from = first - h + 1, .fragments = fragments};
}

}  // namespace tern

#endif  // TERN_WORKER_STEP_SCHEDULE_H_
