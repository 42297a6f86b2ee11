// A window of steps and exchanges as the link's tuners measure them (link_tuner.h: the update's
// codec; steps_tuner.h: H): their sums, and what they come to.
//
// Thread-safety: a plain value; its owner serializes calls.
#ifndef TERN_WORKER_LINK_WINDOW_H_
#define TERN_WORKER_LINK_WINDOW_H_

#include <algorithm>
#include <cstdint>

namespace tern {

struct LinkWindow {
  double step_seconds = 0;
  double wait_seconds = 0;  // of step_seconds, waiting for messages and pushes
  int64_t steps = 0;
  double push_seconds = 0;  // of the measured exchanges
  double bytes = 0;         // of the measured exchanges
  int exchanges = 0;        // measured
  int unmeasured = 0;       // exchanges with a failed push

  // One step's wall time and the part of it spent waiting.
  void AddStep(double step, double wait) {
    step_seconds += step;
    wait_seconds += std::min(wait, step);
    ++steps;
  }
  // One exchange of an update of `update_bytes` whose pushes took `push` s (the slowest peer's; 0
  // when some push failed: not measured).
  void AddExchange(double update_bytes, double push) {
    if (push <= 0) {
      ++unmeasured;
      return;
    }
    bytes += update_bytes;
    push_seconds += push;
    ++exchanges;
  }
  // `window` exchanges, measured or not, over steps that took time.
  bool Full(int window) const {
    return exchanges + unmeasured >= window && steps > 0 && step_seconds > 0;
  }
  // The share of the steps' time not spent waiting; the compute of a step; an exchange's mean
  // push time and bytes. REQUIRES: Full().
  double cu() const { return 1 - wait_seconds / step_seconds; }
  double compute() const { return (step_seconds - wait_seconds) / static_cast<double>(steps); }
  double push() const { return exchanges > 0 ? push_seconds / exchanges : 0; }
  double update_bytes() const { return exchanges > 0 ? bytes / exchanges : 0; }
};

}  // namespace tern

#endif  // TERN_WORKER_LINK_WINDOW_H_
