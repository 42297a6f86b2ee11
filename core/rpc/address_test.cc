// Addresses as the flags write them and as sockets take them.
#include "core/rpc/address.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

TEST(Address, HostAndPortSplitWithoutTheBrackets) {
  EXPECT_EQ(SplitHostPort("10.0.0.1:7000").host, "10.0.0.1");
  EXPECT_EQ(SplitHostPort("10.0.0.1:7000").port, "7000");
  EXPECT_EQ(SplitHostPort("[fe80::1]:7000").host, "fe80::1");
  EXPECT_EQ(SplitHostPort("[fe80::1]:7000").port, "7000");
  EXPECT_EQ(SplitHostPort("host.example").host, "host.example");
  EXPECT_EQ(SplitHostPort("host.example").port, "");
}

// Resolved addresses print as tern writes them before ":port"; a name that does not resolve
// says so.
TEST(Address, ResolvedAddressesPrintAsTheFlagsWriteThem) {
  auto v4 = Resolve({.host = "127.0.0.1", .port = "7000"}, SOCK_STREAM);
  ASSERT_THAT(v4, IsOk());
  EXPECT_EQ(IpText(v4->front().get()), "127.0.0.1");
  auto v6 = Resolve(SplitHostPort("[::1]:7000"), SOCK_STREAM);
  ASSERT_THAT(v6, IsOk());
  EXPECT_EQ(IpText(v6->front().get()), "[::1]");
  EXPECT_THAT(Resolve({.host = "no-such-host.invalid", .port = "1"}, SOCK_STREAM).status(),
              StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace tern
