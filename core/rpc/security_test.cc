// TLS between a real server and real channels on 127.0.0.1, with certificates from two
// development CAs (core/rpc/dev_certs.h).
#include "core/rpc/security.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/rpc/dev_certs.h"
#include "core/rpc/channel.h"
#include "core/rpc/server.h"
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

TEST_F(Tls, MutualTlsRefusesNoCertificateAnotherCasAnExpiredOneAndPlaintext) {
  StartServer(Files("a", "server"));
  TlsFiles other = Files("b", "client");
  other.ca = File("a", "ca.crt");  // trusts the server, but its own certificate is from CA b
  for (const auto& [what, tls] : std::vector<std::pair<std::string, TlsFiles>>{
           {"no client certificate", Files("a", "")},
           {"a certificate from another CA", other},
           {"an expired certificate", Files("a", "expired")},
           {"plaintext", TlsFiles{}}}) {
    const grpc::Status s = Check(tls);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << what << ": " << s.error_message();
  }
  EXPECT_TRUE(Check(Files("a", "client")).ok()) << "the server goes on serving";
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
