// A notify socket as systemd makes one for a Type=notify service: a Unix datagram socket whose
// path is in NOTIFY_SOCKET (and a watchdog interval in WATCHDOG_USEC, when given) while the
// object lives, for this process and the children it starts meanwhile.
//
// Thread-safety: one thread at a time.
#ifndef TERN_TESTS_TESTING_NOTIFY_SOCKET_H_
#define TERN_TESTS_TESTING_NOTIFY_SOCKET_H_

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace tern::testing {

class NotifySocket {
 public:
  // `watchdog` zero: no WATCHDOG_USEC.
  NotifySocket(const std::string& path, absl::Duration watchdog) : path_(path) {
    unlink(path_.c_str());
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    path_.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
    bound_ = bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
    if (watchdog > absl::ZeroDuration()) {
      setenv("WATCHDOG_USEC", absl::StrCat(absl::ToInt64Microseconds(watchdog)).c_str(), 1);
    }
  }
  ~NotifySocket() {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    close(fd_);
    unlink(path_.c_str());
  }
  bool bound() const { return bound_; }

  // The next datagram within 30 s ("" if none); with `skip_pings`, the next other than
  // WATCHDOG=1.
  std::string Next(bool skip_pings = false) {
    while (true) {
      const std::string m = Receive(30);
      if (!skip_pings || m != "WATCHDOG=1") return m;
    }
  }
  // Whether a watchdog ping comes within 30 s.
  bool WaitForPing() {
    for (std::string m = Receive(30); !m.empty(); m = Receive(30)) {
      if (m == "WATCHDOG=1") return true;
    }
    return false;
  }
  // Every datagram waiting now, each followed by '|'.
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
  std::string Receive(int seconds) {
    timeval tv{seconds, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }

  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

}  // namespace tern::testing

#endif  // TERN_TESTS_TESTING_NOTIFY_SOCKET_H_
