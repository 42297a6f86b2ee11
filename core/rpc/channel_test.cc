// The channel factory against a real server on 127.0.0.1 reached through a proxy that holds the
// server's first bytes back, as a slow link or a loaded host does with a handshake.
#include "core/rpc/channel.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/rpc/server.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;

// Forwards every connection to 127.0.0.1:`to`, starting the server's side `delay` late.
//
// Thread-safety: one accept thread and two pump threads a connection, all joined by the
// destructor; the pumps touch only their own two sockets.
class DelayingProxy {
 public:
  DelayingProxy(int to, absl::Duration delay) : to_(to), delay_(delay) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = Loopback(0);
    socklen_t len = sizeof(a);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        listen(listener_, 8) == 0 &&
        getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~DelayingProxy() {
    stopping_ = true;
    shutdown(listener_, SHUT_RDWR);
    acceptor_.join();
    absl::MutexLock l(&mu_);  // no new pumps: the acceptor is gone
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    for (std::thread& t : pumps_) t.join();
    for (int fd : fds_) close(fd);
    close(listener_);
  }
  int port() const { return port_; }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    return a;
  }
  void Accept() {
    while (!stopping_) {
      const int client = accept(listener_, nullptr, nullptr);
      if (client < 0) return;
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      const sockaddr_in a = Loopback(to_);
      if (connect(server, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) {
        close(server);
        close(client);
        continue;
      }
      absl::MutexLock l(&mu_);
      fds_.push_back(client);
      fds_.push_back(server);
      pumps_.emplace_back([client, server] { Pump(client, server, absl::ZeroDuration()); });
      pumps_.emplace_back([server, client, d = delay_] { Pump(server, client, d); });
    }
  }
  static void Pump(int from, int to, absl::Duration delay) {
    absl::SleepFor(delay);
    char buf[16384];
    for (;;) {
      const ssize_t n = read(from, buf, sizeof(buf));
      // MSG_NOSIGNAL: a side that hung up ends the pump, not the test (SIGPIPE).
      if (n <= 0 || send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
    }
    shutdown(to, SHUT_WR);
  }

  const int to_;
  const absl::Duration delay_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

// gRPC gives one connection attempt (TCP, TLS, HTTP/2 settings) at least its "min reconnect
// backoff"; a call without wait_for_ready fails as soon as an attempt does. A handshake that
// takes 400 ms must not fail the first call.
TEST(Channel, TheFirstCallSucceedsWhenTheHandshakeTakesLongerThanTheReconnectBackoff) {
  int port = 0;
  auto server = StartGrpcServer("127.0.0.1:0", {}, &port);
  ASSERT_THAT(server.status(), IsOk());
  DelayingProxy proxy(port, absl::Milliseconds(400));
  ASSERT_GT(proxy.port(), 0);
  for (ChannelKind kind : {ChannelKind::kDefault, ChannelKind::kPeer}) {
    auto health = grpc::health::v1::Health::NewStub(
        MakeChannel(absl::StrCat("127.0.0.1:", proxy.port()), kind));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::health::v1::HealthCheckResponse r;
    const grpc::Status s = health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &r);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  (*server)->Shutdown(absl::ToChronoTime(absl::Now()));
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// A list of addresses becomes one target that gRPC walks in order (an aggregator and its
// standby); a single address, a scheme and a name that does not resolve are left as they are.
TEST(ChannelTarget, AListOfAddressesIsOneTargetInTheirOrder) {
  EXPECT_EQ(ChannelTarget("127.0.0.1:7000"), "127.0.0.1:7000");
  EXPECT_EQ(ChannelTarget("dns:///a:1,b:2"), "dns:///a:1,b:2");
  EXPECT_EQ(ChannelTarget("127.0.0.1:7000,127.0.0.2:7001"), "ipv4:127.0.0.1:7000,127.0.0.2:7001");
  EXPECT_EQ(ChannelTarget("localhost:7000, 127.0.0.1:7001"), "ipv4:127.0.0.1:7000,127.0.0.1:7001");
  EXPECT_EQ(ChannelTarget("[::1]:7000,[::1]:7001"), "ipv6:[::1]:7000,[::1]:7001");
  EXPECT_EQ(ChannelTarget("127.0.0.1:7000,no-such-host.invalid:1"), "ipv4:127.0.0.1:7000");
  EXPECT_EQ(ChannelTarget("127.0.0.1:7000,[::1]:7001"), "ipv4:127.0.0.1:7000");
}

// A channel to [a server that is gone, one that serves] reaches the second.
TEST(ChannelTarget, AChannelToAListReachesTheFirstThatServes) {
  int port = 0;
  auto server = StartGrpcServer("127.0.0.1:0", {}, &port);
  ASSERT_THAT(server, IsOk());
  int gone = 0;
  {
    auto first = StartGrpcServer("127.0.0.1:0", {}, &gone);
    ASSERT_THAT(first, IsOk());
    (*first)->Shutdown();
  }
  auto stub = grpc::health::v1::Health::NewStub(
      MakeChannel(absl::StrCat("127.0.0.1:", gone, ",127.0.0.1:", port)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse reply;
  EXPECT_TRUE(stub->Check(&ctx, req, &reply).ok());
  (*server)->Shutdown();
}

}  // namespace
}  // namespace tern
