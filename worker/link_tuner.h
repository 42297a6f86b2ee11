// Chooses the codec of diloco's updates from the link as measured, to keep the worker's compute
// utilization (CU: the share of a step's wall time not spent waiting for messages or pushes) at a
// target (--codec_ladder, --cu_target; docs/worker.md "Choosing the update's width from the
// link"). The codecs form a ladder, widest first (e.g. none, int8, fp4). Each window of exchanges
// measures the steps' CU and the link: how long this worker's pushes took for how many bytes.
// An exchange that its overlap does not hide (push time beyond overlap_steps steps of compute)
// while CU is under the target moves one rung narrower; one rung wider is tried when the link, as
// measured, would carry the wider update within the target (its time scaled by the bytes, the
// round trip counted as if it grew with them: a prediction that errs narrow). A rung left for
// being too slow is not tried again for the next 1, 2, 4, ... windows (up to 64), so a link at
// the edge does not flap. Each worker decides alone: messages name their codec, so a group may mix
// them.
//
// Thread-safety: thread-safe. The engine's step thread observes and decides; a metrics scrape
// reads Snapshot() from another thread.
#ifndef TERN_WORKER_LINK_TUNER_H_
#define TERN_WORKER_LINK_TUNER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/registry.h"
#include "worker/link_window.h"

namespace tern {

struct LinkTunerOptions {
  std::vector<std::string> codecs;  // codec specs, widest first
  std::string start;                // the rung to start on (one of codecs)
  double cu_target = 0.9;
  int exchanges_per_window = 4;  // exchanges measured before each decision
  int overlap_steps = 0;         // steps of compute an exchange overlaps (0: none)
};

// What the tuner measured and chose (for metrics and logs).
struct LinkState {
  std::string codec;                // the rung in use
  uint64_t changes = 0;             // rungs changed so far
  double cu = 0;                    // the last window's measured CU (0 before the first)
  double push_seconds = 0;          // the last window's mean push time of one update
  double megabytes_per_second = 0;  // the bytes of one update over that time
};

class LinkTuner {
 public:
  // Refuses an empty ladder, a start not on it, a codec the registry does not build, a ladder not
  // ordered widest first, and a target outside (0, 1).
  static absl::StatusOr<std::unique_ptr<LinkTuner>> Create(LinkTunerOptions options,
                                                           const CodecRegistry& codecs);

  // One step's wall time and the part of it spent waiting (for messages and pushes).
  void ObserveStep(double step_seconds, double wait_seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // One exchange: an update of `bytes` whose pushes took `push_seconds` (the slowest peer's);
  // `push_seconds` 0 when some push failed (not measured).
  void ObserveExchange(uint64_t bytes, double push_seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // After a full window: the codec to switch to and why, or nothing (stay). Starts a new window.
  struct Change {
    std::string codec;
    std::string why;
  };
  std::optional<Change> Decide() ABSL_LOCKS_EXCLUDED(mu_);

  LinkState Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  LinkTuner(LinkTunerOptions options, std::vector<double> bytes_per_value, size_t rung)
      : options_(std::move(options)),
        bytes_per_value_(std::move(bytes_per_value)),
        window_(std::max(1, options_.exchanges_per_window)),
        held_(options_.codecs.size(), 0),
        holds_(options_.codecs.size(), 0),
        rung_(rung) {
    state_.codec = options_.codecs[rung];
  }

  const LinkTunerOptions options_;
  const std::vector<double> bytes_per_value_;  // each rung's, measured on a probe at Create
  const int window_;
  mutable absl::Mutex mu_;
  // Windows each rung is still held off for, and how many times it was left for being slow.
  // Counted down only while the rung below it is in use (the only time it could be tried).
  std::vector<int> held_ ABSL_GUARDED_BY(mu_);
  std::vector<int> holds_ ABSL_GUARDED_BY(mu_);
  size_t rung_ ABSL_GUARDED_BY(mu_);
  LinkWindow measured_ ABSL_GUARDED_BY(mu_);  // the window so far
  LinkState state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern

#endif  // TERN_WORKER_LINK_TUNER_H_
