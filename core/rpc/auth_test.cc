// Who a call is: certificates from the CA and tokens from the file name their holder; every
// other credential is refused with the reason. Uses development certificates (openssl).
#include "core/rpc/auth.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "core/rpc/dev_certs.h"
#include "core/rpc/grpc_log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::testing::HasSubstr;

class Auth : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/auth-", getpid()));
    DevCertOptions o;
    o.names = {"client-0", "client-1"};
    ASSERT_THAT(MakeDevCertificates(*dir_ + "/a", o), IsOk());
    ASSERT_THAT(MakeDevCertificates(*dir_ + "/b", o), IsOk());  // another CA, same names
    o.names = {"expired"};
    o.days = 0;
    ASSERT_THAT(MakeDevCertificates(*dir_ + "/a", o), IsOk());
    ASSERT_THAT(MakeTokens(*dir_ + "/t", {"client-0", "client-1"}), IsOk());
  }
  static std::string Pem(const std::string& ca, const std::string& who) {
    absl::StatusOr<std::string> pem = ReadFile(absl::StrCat(*dir_, "/", ca, "/", who, ".crt"));
    EXPECT_THAT(pem.status(), IsOk());
    return pem.value_or("");
  }
  static std::string Bearer(const std::string& who) {
    absl::StatusOr<std::string> t = ReadFile(absl::StrCat(*dir_, "/t/", who, ".token"));
    EXPECT_THAT(t.status(), IsOk());
    std::string token = t.value_or("");
    while (!token.empty() && token.back() == '\n') token.pop_back();
    return "Bearer " + token;
  }
  std::shared_ptr<CallAuthenticator> Make(bool ca, bool tokens) {
    AuthOptions o;
    if (ca) o.ca = *dir_ + "/a/ca.crt";
    if (tokens) o.tokens = *dir_ + "/t/tokens";
    o.refresh = absl::Seconds(5);
    auto a = CallAuthenticator::Create(o, &clock_);
    EXPECT_THAT(a.status(), IsOk());
    return a.value_or(nullptr);
  }

  static std::string* dir_;
  // Now: the expired certificate's notAfter has passed (it was made valid for no time).
  ::tern::testing::FakeClock clock_{absl::Now() + absl::Seconds(5)};
};
std::string* Auth::dir_ = nullptr;

TEST_F(Auth, ACertificateFromTheCaNamesItsHolder) {
  auto a = Make(/*ca=*/true, /*tokens=*/false);
  EXPECT_EQ(a->Authenticate("", Pem("a", "client-1"), "").value_or("?"), "client-1");
  // Again from the cache, the same answer.
  EXPECT_EQ(a->Authenticate("", Pem("a", "client-1"), "").value_or("?"), "client-1");
}

TEST_F(Auth, AnotherCasAnExpiredOrNoCertificateIsRefusedWithTheReason) {
  auto a = Make(/*ca=*/true, /*tokens=*/false);
  absl::StatusOr<std::string> other = a->Authenticate("", Pem("b", "client-0"), "");
  EXPECT_TRUE(absl::IsUnauthenticated(other.status()));
  EXPECT_THAT(other.status().message(), HasSubstr("(CN=client-0) is not signed by this server's"));
  absl::StatusOr<std::string> expired = a->Authenticate("", Pem("a", "expired"), "");
  EXPECT_TRUE(absl::IsUnauthenticated(expired.status()));
  EXPECT_THAT(expired.status().message(), HasSubstr("(CN=expired) expired at"));
  absl::StatusOr<std::string> none = a->Authenticate("", "", "");
  EXPECT_TRUE(absl::IsUnauthenticated(none.status()));
  EXPECT_THAT(none.status().message(), HasSubstr("no credentials"));
  EXPECT_TRUE(absl::IsUnauthenticated(a->Authenticate("", "garbage", "").status()));
}

TEST_F(Auth, ACertificateStopsWorkingWhenItExpiresAfterItWasCached) {
  auto a = Make(/*ca=*/true, /*tokens=*/false);
  ASSERT_EQ(a->Authenticate("", Pem("a", "client-0"), "").value_or("?"), "client-0");
  clock_.Advance(absl::Hours(24 * 900));  // past the 825 days tern certs gives
  EXPECT_TRUE(absl::IsUnauthenticated(a->Authenticate("", Pem("a", "client-0"), "").status()));
}

TEST_F(Auth, ATokenNamesItsHolderAndOtherTokensAreRefused) {
  auto a = Make(/*ca=*/true, /*tokens=*/true);
  EXPECT_EQ(a->Authenticate(Bearer("client-1"), "", "").value_or("?"), "client-1");
  // The token names the caller even beside another holder's (valid) certificate.
  EXPECT_EQ(a->Authenticate(Bearer("client-1"), Pem("a", "client-0"), "").value_or("?"),
            "client-1");
  // ... but an invalid certificate is refused even with a good token.
  EXPECT_TRUE(absl::IsUnauthenticated(
      a->Authenticate(Bearer("client-1"), Pem("b", "client-1"), "").status()));
  absl::StatusOr<std::string> unknown = a->Authenticate("Bearer tern_0123", "", "");
  EXPECT_TRUE(absl::IsUnauthenticated(unknown.status()));
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown bearer token"));
  EXPECT_TRUE(absl::IsUnauthenticated(a->Authenticate("Basic abc", "", "").status()));
  auto no_tokens = Make(/*ca=*/true, /*tokens=*/false);
  EXPECT_THAT(no_tokens->Authenticate(Bearer("client-1"), "", "").status().message(),
              HasSubstr("takes no bearer tokens"));
}

TEST_F(Auth, ATokenMadeAgainRevokesTheOldOneOnceTheFileIsReRead) {
  const std::string dir = *dir_ + "/t2";
  ASSERT_THAT(MakeTokens(dir, {"client-0", "client-1"}), IsOk());
  struct stat st;
  ASSERT_EQ(stat((dir + "/client-0.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "a token file is its holder's secret";
  AuthOptions o;
  o.tokens = dir + "/tokens";
  o.refresh = absl::Seconds(5);
  auto a = CallAuthenticator::Create(o, &clock_);
  ASSERT_THAT(a.status(), IsOk());
  auto bearer = [&](const std::string& who) {
    return "Bearer " + ReadFile(dir + "/" + who + ".token").value_or("").substr(0, 69);
  };
  const std::string old = bearer("client-0");
  ASSERT_EQ((*a)->Authenticate(old, "", "").value_or("?"), "client-0");
  ASSERT_THAT(MakeTokens(dir, {"client-0"}), IsOk());
  EXPECT_EQ((*a)->Authenticate(old, "", "").value_or("?"), "client-0") << "not re-read yet";
  clock_.Advance(absl::Seconds(6));
  EXPECT_TRUE(absl::IsUnauthenticated((*a)->Authenticate(old, "", "").status()));
  EXPECT_EQ((*a)->Authenticate(bearer("client-0"), "", "").value_or("?"), "client-0");
  EXPECT_EQ((*a)->Authenticate(bearer("client-1"), "", "").value_or("?"), "client-1")
      << "the other holders keep their tokens";
}

TEST_F(Auth, WithoutCaOrTokensACallIsAnonymous) {
  auto a = CallAuthenticator::Create(AuthOptions{}, &clock_);
  ASSERT_THAT(a.status(), IsOk());
  EXPECT_EQ((*a)->Authenticate("", "", "").value_or("?"), "");
}

TEST(AuthFiles, AMalformedTokensFileOrCaIsAnErrorNamingIt) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/authfiles-", getpid());
  ASSERT_THAT(MakeDirectory(dir), IsOk());
  ASSERT_THAT(WriteFileAtomically(dir + "/tokens", "client-0 sha256:abc\n"), IsOk());
  AuthOptions o;
  o.tokens = dir + "/tokens";
  absl::Status s = CallAuthenticator::Create(o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("line 1"));
  ASSERT_THAT(WriteFileAtomically(dir + "/ca.crt", "not a certificate"), IsOk());
  AuthOptions c;
  c.ca = dir + "/ca.crt";
  EXPECT_THAT(CallAuthenticator::Create(c).status().message(), HasSubstr("no PEM certificate"));
  EXPECT_FALSE(MakeTokens(dir, {"two words"}).ok());
}

TEST(AuthNames, PatternsAreNamesOrPrefixes) {
  EXPECT_TRUE(PrincipalAllowed({}, "anyone"));
  EXPECT_TRUE(PrincipalAllowed({"worker-*"}, "worker-12"));
  EXPECT_TRUE(PrincipalAllowed({"server", "worker-*"}, "server"));
  EXPECT_FALSE(PrincipalAllowed({"worker-*"}, "client-0"));
  EXPECT_FALSE(PrincipalAllowed({"worker-0"}, "worker-01"));
  EXPECT_FALSE(PrincipalAllowed({"worker-*"}, ""));
}

TEST(GrpcLog, AFailedHandshakeIsSaidInTernsWords) {
  EXPECT_THAT(ExplainHandshakeFailure("Handshake failed with fatal error SSL_ERROR_SSL: "
                                      "error:0A00010B:SSL routines::wrong version number."),
              HasSubstr("spoke plaintext"));
  EXPECT_THAT(ExplainHandshakeFailure("Handshake failed with fatal error SSL_ERROR_SSL: "
                                      "error:0A000086:SSL routines::certificate verify failed."),
              HasSubstr("failed verification against --tls_ca"));
  EXPECT_EQ(ExplainHandshakeFailure("subchannel connect failed"), "");
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// A caller is on this host when it calls from loopback, a Unix socket, this process, or one of
// the host's own interface addresses (a script beside a worker that listens on the host's
// address, as `tern launch` starts them); any other address is not.
TEST(LocalPeer, LoopbackUnixInProcessAndTheHostsOwnAddressesAreThisHost) {
  for (const char* p : {"ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "ipv6:%5B::1%5D:5000",
                        "unix:/tmp/tern.sock", "unknown", "inproc"}) {
    EXPECT_TRUE(IsLocalPeer(p)) << p;
  }
  for (const char* p : {"ipv4:192.0.2.1:5000", "ipv6:[2001:db8::1]:5000", "ipv4:", "ipv6:[", ""}) {
    EXPECT_FALSE(IsLocalPeer(p)) << p;
  }
  // This host's address toward a documentation network (a UDP socket's connect sends nothing).
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);
  inet_pton(AF_INET, "192.0.2.1", &to.sin_addr);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  const bool routed = connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 &&
                      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  close(fd);
  if (!routed) GTEST_SKIP() << "no route off this host: no address of its own but loopback";
  char ip[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &local.sin_addr, ip, sizeof(ip));
  EXPECT_TRUE(IsLocalPeer(absl::StrCat("ipv4:", ip, ":5000"))) << ip;
  EXPECT_TRUE(IsLocalPeer(absl::StrCat("ipv6:[::ffff:", ip, "]:5000"))) << ip;
}

}  // namespace
}  // namespace tern
