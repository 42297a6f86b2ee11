// The one place daemons start their gRPC servers.
#include "core/rpc/server.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

// A second daemon started on a port already served is refused, not let in beside the first to
// take half its connections (gRPC's default SO_REUSEPORT would have). `tern launch` relies on it:
// only one launcher can serve the rendezvous.
TEST(GrpcServer, ASecondServerOnAPortInUseIsRefused) {
  int port = 0;
  auto first = StartGrpcServer("127.0.0.1:0", {}, &port);
  ASSERT_THAT(first, IsOk());
  ASSERT_GT(port, 0);
  int again = 0;
  EXPECT_THAT(StartGrpcServer("127.0.0.1:" + std::to_string(port), {}, &again).status(),
              StatusIs(absl::StatusCode::kUnavailable));
  (*first)->Shutdown();
  int after = 0;
  auto later = StartGrpcServer("127.0.0.1:" + std::to_string(port), {}, &after);
  ASSERT_THAT(later, IsOk()) << "the port is free again once the first stopped";
  EXPECT_EQ(after, port);
  (*later)->Shutdown();
}

}  // namespace
}  // namespace tern
