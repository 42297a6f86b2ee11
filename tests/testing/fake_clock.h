// A clock that moves only when told to (or when the code under test sleeps on it).
//
// Thread-safety: thread-safe.
#ifndef TERN_TESTS_TESTING_FAKE_CLOCK_H_
#define TERN_TESTS_TESTING_FAKE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace tern::testing {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24 * 365 * 50))
      : now_(start) {}
  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  // Sleeping advances the clock at once.
  void SleepFor(absl::Duration d) override { Advance(d); }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern::testing

#endif  // TERN_TESTS_TESTING_FAKE_CLOCK_H_
