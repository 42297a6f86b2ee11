// TLS between a real server and real channels on 127.0.0.1, with certificates from two
// development CAs (core/rpc/dev_certs.h).
#include "core/rpc/security.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/rpc/auth.h"
#include "core/rpc/dev_certs.h"
#include "core/rpc/channel.h"
#include "core/rpc/server.h"
#include "core/rpc/status.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::testing::HasSubstr;

class Tls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/tls-", getpid()));
    DevCertOptions o;
    o.names = {"server", "client"};
    ASSERT_THAT(MakeDevCertificates(*dir_ + "/a", o), IsOk());
    o.names = {"server", "client"};
    ASSERT_THAT(MakeDevCertificates(*dir_ + "/b", o), IsOk());  // another CA
    o.names = {"expired"};
    o.days = 0;  // not after: now
    ASSERT_THAT(MakeDevCertificates(*dir_ + "/a", o), IsOk());
    absl::SleepFor(absl::Seconds(1.5));
  }
  static std::string File(const std::string& ca, const std::string& name) {
    return absl::StrCat(*dir_, "/", ca, "/", name);
  }
  static TlsFiles Files(const std::string& ca, const std::string& who, bool with_ca = true) {
    TlsFiles t;
    if (!who.empty()) {
      t.cert = File(ca, who + ".crt");
      t.key = File(ca, who + ".key");
    }
    if (with_ca) t.ca = File(ca, "ca.crt");
    t.refresh_s = 1;
    return t;
  }
  void StartServer(const TlsFiles& tls) {
    auto creds = ServerCredentialsFor(tls, "127.0.0.1:0");
    ASSERT_THAT(creds.status(), IsOk());
    auto s = StartGrpcServer("127.0.0.1:0", {}, &port_, *creds);
    ASSERT_THAT(s.status(), IsOk());
    server_ = *std::move(s);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now()));
  }
  // The health check's status over a fresh channel with `tls`.
  grpc::Status Check(const TlsFiles& tls) {
    auto creds = ChannelCredentialsFor(tls);
    EXPECT_THAT(creds.status(), IsOk());
    auto stub = grpc::health::v1::Health::NewStub(
        MakeChannel(absl::StrCat("127.0.0.1:", port_), ChannelKind::kDefault, *creds));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::health::v1::HealthCheckResponse r;
    return stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &r);
  }

  static std::string* dir_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};
std::string* Tls::dir_ = nullptr;

TEST_F(Tls, MutualTlsTakesAClientCertificateFromItsCa) {
  StartServer(Files("a", "server"));
  EXPECT_TRUE(Check(Files("a", "client")).ok());
}

TEST_F(Tls, MutualTlsRefusesNoCertificateAnotherCasAnExpiredOneAndPlaintextSayingWhy) {
  StartServer(Files("a", "server"));
  TlsFiles other = Files("b", "client");
  other.ca = File("a", "ca.crt");  // trusts the server, but its own certificate is from CA b
  struct Case {
    std::string what;
    TlsFiles tls;
    grpc::StatusCode code;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"no client certificate", Files("a", ""), grpc::StatusCode::UNAUTHENTICATED,
            "no credentials"},
           {"a certificate from another CA", other, grpc::StatusCode::UNAUTHENTICATED,
            "another CA"},
           {"an expired certificate", Files("a", "expired"), grpc::StatusCode::UNAUTHENTICATED,
            "(CN=expired) expired"},
           // A plaintext client cannot hear a status: its connection is hung up on.
           {"plaintext", TlsFiles{}, grpc::StatusCode::UNAVAILABLE, "needs --tls_ca"}}) {
    const grpc::Status s = Check(c.tls);
    EXPECT_EQ(s.error_code(), c.code) << c.what << ": " << s.error_message();
    EXPECT_THAT(std::string(FromGrpcStatus(s).message()), HasSubstr(c.says)) << c.what;
  }
  EXPECT_TRUE(Check(Files("a", "client")).ok()) << "the server goes on serving";
}

TEST_F(Tls, ABearerTokenOverTlsAuthenticatesAClientWithoutACertificate) {
  ASSERT_THAT(MakeTokens(*dir_ + "/t", {"client-7"}), IsOk());
  TlsFiles server = Files("a", "server", /*with_ca=*/false);
  server.tokens = *dir_ + "/t/tokens";
  StartServer(server);
  TlsFiles client = Files("a", "");
  client.token = *dir_ + "/t/client-7.token";
  const grpc::Status with = Check(client);
  EXPECT_TRUE(with.ok()) << with.error_code() << " " << with.error_message();
  const grpc::Status none = Check(Files("a", ""));
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
  EXPECT_THAT(none.error_message(), HasSubstr("a bearer token (--token_file)"));
  // A token is never sent in plaintext.
  TlsFiles plain;
  plain.token = client.token;
  EXPECT_THAT(std::string(ChannelCredentialsFor(plain).status().message()),
              HasSubstr("a token sent in plaintext"));
}

TEST_F(Tls, AClientRefusesAServerItsCaDidNotSign) {
  StartServer(Files("b", "server", /*with_ca=*/false));  // TLS, no client certificates asked
  EXPECT_FALSE(Check(Files("a", "")).ok());
  EXPECT_TRUE(Check(Files("b", "")).ok());
}

TEST_F(Tls, ARenewedCertificateIsServedWithoutARestart) {
  const std::string dir = absl::StrCat(*dir_, "/live");
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", dir, " && cp ", File("a", "server.crt"), " ",
                                     File("a", "server.key"), " ", dir)
                            .c_str()),
            0);
  TlsFiles live;
  live.cert = dir + "/server.crt";
  live.key = dir + "/server.key";
  live.refresh_s = 1;
  StartServer(live);
  EXPECT_TRUE(Check(Files("a", "")).ok());
  // The operator renews the certificate from CA b; clients of CA b get in once it is read.
  ASSERT_EQ(std::system(
                absl::StrCat("cp ", File("b", "server.crt"), " ", File("b", "server.key"), " ", dir)
                    .c_str()),
            0);
  bool renewed = false;
  for (int i = 0; i < 100 && !renewed; ++i) {
    renewed = Check(Files("b", "")).ok();
    if (!renewed) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(renewed);
  EXPECT_FALSE(Check(Files("a", "")).ok());
}

TEST(TlsPolicy, PlaintextBeyondLoopbackOnlyWhenAskedFor) {
  auto refused = ServerCredentialsFor(TlsFiles{}, "0.0.0.0:7070");
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_THAT(refused.status().message(), HasSubstr("--plaintext"));
  TlsFiles asked;
  asked.plaintext = true;
  EXPECT_THAT(ServerCredentialsFor(asked, "0.0.0.0:7070").status(), IsOk());
  EXPECT_THAT(ServerCredentialsFor(TlsFiles{}, "127.0.0.1:7070").status(), IsOk());
  EXPECT_THAT(ServerCredentialsFor(TlsFiles{}, "localhost:0").status(), IsOk());
  EXPECT_TRUE(IsLoopback("[::1]:80"));
  EXPECT_FALSE(IsLoopback("10.0.0.1:80"));
}

TEST(TlsPolicy, MissingFilesAndHalfPairsAreClearErrors) {
  TlsFiles half;
  half.cert = "/nonexistent.crt";
  EXPECT_THAT(ServerCredentialsFor(half, "127.0.0.1:0").status().message(),
              HasSubstr("go together"));
  half.key = "/nonexistent.key";
  EXPECT_THAT(ServerCredentialsFor(half, "127.0.0.1:0").status().message(),
              HasSubstr("/nonexistent.crt"));
  TlsFiles no_ca;
  no_ca.ca = "/nonexistent-ca.crt";
  EXPECT_THAT(ChannelCredentialsFor(no_ca).status().message(), HasSubstr("/nonexistent-ca.crt"));
}

}  // namespace
}  // namespace tern
