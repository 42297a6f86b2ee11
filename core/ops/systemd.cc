#include "core/ops/systemd.h"

#include <systemd/sd-daemon.h>

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tern {

SystemdNotifier::SystemdNotifier(std::function<bool()> alive) : alive_(std::move(alive)) {
  uint64_t usec = 0;
  // > 0 only when WATCHDOG_USEC is set (and WATCHDOG_PID, if set, is this process).
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0 && usec > 0) {
    watchdog_ = absl::Microseconds(static_cast<int64_t>(usec));
    thread_ = std::thread([this] { WatchdogThread(); });
  }
}

SystemdNotifier::~SystemdNotifier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void SystemdNotifier::Ready(const std::string& status) {
  sd_notify(0, absl::StrCat("READY=1\nSTATUS=", status).c_str());
}

void SystemdNotifier::Status(const std::string& status) {
  sd_notify(0, absl::StrCat("STATUS=", status).c_str());
}

void SystemdNotifier::Stopping() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sd_notify(0, "STOPPING=1");
}

// Pings at a quarter of the interval (systemd's advice is half; a quarter leaves room for a
// slow check), each time only if the daemon says it is alive.
void SystemdNotifier::WatchdogThread() {
  const absl::Duration period = watchdog_ / 4;
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.Unlock();
    const bool alive = alive_();
    if (alive) sd_notify(0, "WATCHDOG=1");
    mu_.Lock();
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), period);
  }
}

}  // namespace tern
