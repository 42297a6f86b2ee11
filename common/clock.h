// The time source of code whose behaviour depends on time passing (back-off, give-up limits),
// injected so tests run it on a fake clock instead of sleeping.
//
// Thread-safety: RealClock is stateless and thread-safe; fakes say their own.
#ifndef TERN_COMMON_CLOCK_H_
#define TERN_COMMON_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tern {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  virtual void SleepFor(absl::Duration d) = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
};

}  // namespace tern

#endif  // TERN_COMMON_CLOCK_H_
