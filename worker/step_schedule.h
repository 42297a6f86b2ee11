// diloco's exchange schedule, which the group may move during a run (--local_steps_max) and a
// joiner takes with the group's state.
//
// Thread-safety: a plain value.
#ifndef TERN_WORKER_STEP_SCHEDULE_H_
#define TERN_WORKER_STEP_SCHEDULE_H_

#include <cstdint>

namespace tern {

// The most steps between exchanges diloco's H may take (TensorBundle.propose_local_steps).
inline constexpr uint32_t kMaxLocalSteps = 1 << 20;

// A lane exchanges at step s when s >= from and (s + 1 - from) is a multiple of period
// (TensorBundle.schedules).
struct StepSchedule {
  int64_t period = 1;
  int64_t from = 0;
  bool operator==(const StepSchedule&) const = default;
};

}  // namespace tern

#endif  // TERN_WORKER_STEP_SCHEDULE_H_
