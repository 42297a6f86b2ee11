// Ends a test that runs past its deadline: prints what hung and aborts the process, so that a
// hang (a push that never ends, a shutdown waiting on a call) fails in seconds with a message
// rather than at ctest's timeout, minutes later, with none.
//
// Thread-safety: construct and destroy on one thread; the watching thread touches only its own
// state.
#ifndef TERN_TESTS_TESTING_WATCHDOG_H_
#define TERN_TESTS_TESTING_WATCHDOG_H_

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tern::testing {

class Watchdog {
 public:
  Watchdog(std::string what, absl::Duration deadline)
      : thread_([this, what = std::move(what), deadline] {
          if (disarmed_.WaitForNotificationWithTimeout(deadline)) return;
          std::fprintf(stderr, "watchdog: %s did not end within %s; aborting\n", what.c_str(),
                       absl::FormatDuration(deadline).c_str());
          std::fflush(stderr);
          std::abort();
        }) {}
  ~Watchdog() {
    disarmed_.Notify();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  absl::Notification disarmed_;
  std::thread thread_;
};

}  // namespace tern::testing

#endif  // TERN_TESTS_TESTING_WATCHDOG_H_
