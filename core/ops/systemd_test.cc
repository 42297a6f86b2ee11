#include "core/ops/systemd.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

// A notify socket as systemd makes one: a Unix datagram socket whose path is in NOTIFY_SOCKET.
class FakeSystemd {
 public:
  explicit FakeSystemd(absl::Duration watchdog) {
    path_ = absl::StrCat(::testing::TempDir(), "/notify-", getpid());
    unlink(path_.c_str());
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    path_.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
    if (watchdog > absl::ZeroDuration()) {
      setenv("WATCHDOG_USEC", absl::StrCat(absl::ToInt64Microseconds(watchdog)).c_str(), 1);
      setenv("WATCHDOG_PID", absl::StrCat(getpid()).c_str(), 1);
    }
  }
  ~FakeSystemd() {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    close(fd_);
    unlink(path_.c_str());
  }
  // The next datagram, waiting up to 10 s; "" when none came.
  std::string Next() {
    timeval tv{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }
  // Every datagram waiting now.
  std::string Drain() {
    std::string all;
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
      all.append(buf, static_cast<size_t>(n)).append("|");
    }
    return all;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST(SystemdNotifier, SaysReadyWithItsStatusAndStoppingOnTheNotifySocket) {
  FakeSystemd systemd(absl::ZeroDuration());
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
  FakeSystemd systemd(absl::Milliseconds(200));
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
