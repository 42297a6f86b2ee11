// systemd's notify protocol for a daemon run as a Type=notify service: READY=1 once it serves,
// STATUS= lines, WATCHDOG=1 pings while it is healthy, STOPPING=1 when it shuts down
// (sd_notify(3), through Debian's libsystemd). Outside systemd (no NOTIFY_SOCKET) every call
// does nothing, so the daemons call it unconditionally.
//
// Thread-safety: thread-safe. The `alive` check runs on the notifier's own thread.
#ifndef TERN_CORE_OPS_SYSTEMD_H_
#define TERN_CORE_OPS_SYSTEMD_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tern {

class SystemdNotifier {
 public:
  // `alive` says whether the daemon still does its work (e.g. its round loop answers); while it
  // says no, the watchdog goes unfed and systemd restarts the service after WatchdogSec. It is
  // polled only when systemd asked for a watchdog (WATCHDOG_USEC for this process).
  explicit SystemdNotifier(std::function<bool()> alive);
  // Stops the watchdog thread (without STOPPING=1: call Stopping() first).
  ~SystemdNotifier();

  // READY=1 with a status line: the daemon serves from now on.
  void Ready(const std::string& status);
  void Status(const std::string& status);
  // STOPPING=1; the watchdog stops pinging.
  void Stopping();

  // The watchdog interval systemd set for this process (WATCHDOG_USEC), or zero.
  absl::Duration watchdog() const { return watchdog_; }

 private:
  void WatchdogThread();

  const std::function<bool()> alive_;
  absl::Duration watchdog_ = absl::ZeroDuration();
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tern

#endif  // TERN_CORE_OPS_SYSTEMD_H_
