#include "core/ops/systemd.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/notify_socket.h"

namespace tern {
namespace {

using ::tern::testing::NotifySocket;

std::string SocketPath() { return absl::StrCat(::testing::TempDir(), "/notify-", getpid()); }

TEST(SystemdNotifier, SaysReadyWithItsStatusAndStoppingOnTheNotifySocket) {
  NotifySocket systemd(SocketPath(), absl::ZeroDuration());
  ASSERT_TRUE(systemd.bound());
  SystemdNotifier n([] { return true; });
  EXPECT_EQ(n.watchdog(), absl::ZeroDuration());
  n.Ready("serving on port 1234");
  EXPECT_EQ(systemd.Next(), "READY=1\nSTATUS=serving on port 1234");
  n.Status("round 3");
  EXPECT_EQ(systemd.Next(), "STATUS=round 3");
  n.Stopping();
  EXPECT_EQ(systemd.Next(), "STOPPING=1");
}

TEST(SystemdNotifier, FeedsTheWatchdogOnlyWhileTheDaemonIsAlive) {
  NotifySocket systemd(SocketPath(), absl::Milliseconds(200));
  setenv("WATCHDOG_PID", absl::StrCat(getpid()).c_str(), 1);
  std::atomic<bool> alive{true};
  std::atomic<int> checks{0};
  SystemdNotifier n([&] {
    ++checks;
    return alive.load();
  });
  EXPECT_EQ(n.watchdog(), absl::Milliseconds(200));
  EXPECT_EQ(systemd.Next(), "WATCHDOG=1");
  EXPECT_EQ(systemd.Next(), "WATCHDOG=1");
  alive = false;
  // Two checks after the switch: every ping sent before it has arrived by then.
  auto wait_checks = [&](int more) {
    const int target = checks.load() + more;
    while (checks.load() < target) absl::SleepFor(absl::Milliseconds(5));
  };
  wait_checks(2);
  systemd.Drain();
  wait_checks(3);
  EXPECT_EQ(systemd.Drain(), "");
  alive = true;
  EXPECT_EQ(systemd.Next(), "WATCHDOG=1");
}

TEST(SystemdNotifier, OutsideSystemdEveryCallDoesNothing) {
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  SystemdNotifier n([] { return true; });
  EXPECT_EQ(n.watchdog(), absl::ZeroDuration());
  n.Ready("x");
  n.Status("y");
  n.Stopping();
}

}  // namespace
}  // namespace tern
