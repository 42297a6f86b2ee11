#include "core/rpc/dev_certs.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(DevCertificates, MakesACaOnceAndAKeyPairPerNameReadableByItsOwnerOnly) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/certs-", getpid());
  DevCertOptions o;
  o.names = {"server", "worker-0"};
  o.hosts = {"10.0.0.5", "node-a.example"};
  ASSERT_THAT(MakeDevCertificates(dir, o), IsOk());
  for (const char* f :
       {"ca.crt", "ca.key", "server.crt", "server.key", "worker-0.crt", "worker-0.key"}) {
    EXPECT_NE(Slurp(absl::StrCat(dir, "/", f)).find("-----BEGIN"), std::string::npos) << f;
  }
  struct stat st;
  ASSERT_EQ(stat((dir + "/server.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Another name later: signed by the same CA, which is not made again.
  const std::string ca = Slurp(dir + "/ca.crt");
  o.names = {"client-7"};
  ASSERT_THAT(MakeDevCertificates(dir, o), IsOk());
  EXPECT_EQ(Slurp(dir + "/ca.crt"), ca);
  EXPECT_NE(Slurp(dir + "/client-7.crt").find("-----BEGIN CERTIFICATE"), std::string::npos);
}

TEST(DevCertificates, WithoutOpensslSaysWhatToInstall) {
  DevCertOptions o;
  o.names = {"x"};
  o.openssl = "/nonexistent/openssl";
  const absl::Status s = MakeDevCertificates(absl::StrCat(::testing::TempDir(), "/nossl"), o);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("openssl package"), std::string::npos) << s;
}

}  // namespace
}  // namespace tern
