#include "common/seqpacket_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;

std::string SocketPath(const std::string& name) {
  return absl::StrCat("/tmp/tern-seqpacket-", getpid(), "-", name, ".sock");
}

int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// One request, one reply; "" when the server hung up.
std::string Call(int fd, const std::string& request) {
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0) return "";
  char buf[256];
  const ssize_t n = recv(fd, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

SeqpacketServer::Handler Echo() {
  return [](absl::string_view r) { return absl::StrCat("re:", r); };
}

TEST(SeqpacketServer, AnswersEachMessageWithItsOwnReplyAndOneClientAfterAnother) {
  auto s = SeqpacketServer::Start(SocketPath("echo"), Echo());
  ASSERT_THAT(s, IsOk());
  struct stat st;
  ASSERT_EQ(stat((*s)->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // only its owner may connect
  for (int client = 0; client < 2; ++client) {
    const int fd = Connect((*s)->path());
    ASSERT_GE(fd, 0);
    EXPECT_EQ(Call(fd, "a"), "re:a");
    EXPECT_EQ(Call(fd, std::string(1000, 'b')), "re:" + std::string(253, 'b'));
    EXPECT_EQ(Call(fd, "c"), "re:c");  // boundaries kept: the cut reply above left nothing
    close(fd);
  }
  (*s)->Stop();
  EXPECT_NE(stat((*s)->path().c_str(), &st), 0);  // the socket file is gone
}

TEST(SeqpacketServer, AnOversizeMessageDropsThatClientAndTheServerGoesOn) {
  auto s = SeqpacketServer::Start(SocketPath("oversize"), Echo());
  ASSERT_THAT(s, IsOk());
  const int fd = Connect((*s)->path());
  ASSERT_GE(fd, 0);
  int big = 1 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
  EXPECT_EQ(Call(fd, std::string(SeqpacketServer::kMaxMessage + 1, 'x')), "");
  close(fd);
  const int again = Connect((*s)->path());
  ASSERT_GE(again, 0);
  EXPECT_EQ(Call(again, "ok"), "re:ok");
  close(again);
}

TEST(SeqpacketServer, StopReturnsWhileAClientIsConnectedAndIdle) {
  auto s = SeqpacketServer::Start(SocketPath("stop"), Echo());
  ASSERT_THAT(s, IsOk());
  const int fd = Connect((*s)->path());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(Call(fd, "x"), "re:x");
  const absl::Time t0 = absl::Now();
  (*s)->Stop();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(Call(fd, "y"), "");  // hung up
  close(fd);
}

TEST(SeqpacketServer, AnExistingPathIsRefused) {
  auto s = SeqpacketServer::Start(SocketPath("twice"), Echo());
  ASSERT_THAT(s, IsOk());
  EXPECT_FALSE(SeqpacketServer::Start((*s)->path(), Echo()).ok());
}

}  // namespace
}  // namespace tern
