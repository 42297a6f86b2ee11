#include "core/rpc/stream_limits.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

StreamLimitOptions Small() {
  StreamLimitOptions o;
  o.max_streams = 4;
  o.max_streams_per_peer = 2;
  o.max_buffered_bytes = 100;
  o.idle_timeout = absl::Seconds(5);
  o.max_duration = absl::Seconds(60);
  o.sweep_every = absl::ZeroDuration();  // the test sweeps
  return o;
}

TEST(StreamLimits, CapsStreamsPerHostAndInTotalNamingTheFlag) {
  StreamLimits l(Small());
  std::vector<std::unique_ptr<StreamLimits::Stream>> open;
  for (int i = 0; i < 2; ++i)
    open.push_back(*l.Open("ipv4:10.0.0.1:" + std::to_string(5000 + i), {}));
  EXPECT_THAT(
      l.Open("ipv4:10.0.0.1:6000", {}).status(),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max_streams_per_peer=2")));
  for (int i = 0; i < 2; ++i)
    open.push_back(*l.Open("ipv4:10.0.0." + std::to_string(2 + i) + ":1", {}));
  EXPECT_THAT(l.Open("ipv4:10.0.0.9:1", {}).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max_streams=4")));
  open.erase(open.begin());  // a slot comes back when a stream ends
  EXPECT_EQ(l.open_streams(), 3);
  EXPECT_THAT(l.Open("ipv4:10.0.0.1:7000", {}), IsOk());
}

TEST(StreamLimits, BufferedBytesStayWithinTheBudgetAndComeBack) {
  StreamLimits l(Small());
  auto a = *l.Open("ipv4:1.1.1.1:1", {});
  auto b = *l.Open("ipv4:2.2.2.2:1", {});
  EXPECT_THAT(a->Hold(60), IsOk());
  EXPECT_THAT(b->Hold(50),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("--max_buffered_mb")));
  EXPECT_THAT(b->Hold(40), IsOk());
  EXPECT_EQ(l.buffered_bytes(), 100u);
  a->ReleaseAll();
  EXPECT_EQ(l.buffered_bytes(), 40u);
  b.reset();
  EXPECT_EQ(l.buffered_bytes(), 0u);
  l.SetMaxBufferedBytes(1000);
  EXPECT_THAT(a->Hold(900), IsOk());
}

TEST(StreamLimits, TheSweeperCancelsIdleAndOverlongStreamsOnce) {
  StreamLimits l(Small());
  std::atomic<int> idle_cancels{0}, busy_cancels{0};
  auto idle = *l.Open("ipv4:1.1.1.1:1", [&] { ++idle_cancels; });
  auto busy = *l.Open("ipv4:2.2.2.2:1", [&] { ++busy_cancels; });
  const absl::Time t0 = absl::Now();
  ASSERT_THAT(busy->Hold(1), IsOk());  // active now
  EXPECT_EQ(l.Sweep(t0 + absl::Seconds(1)), 0);
  EXPECT_EQ(l.Sweep(t0 + absl::Seconds(6)), 2);  // both idle 6 s by then
  EXPECT_EQ(l.Sweep(t0 + absl::Seconds(7)), 0);  // cancelled once
  EXPECT_EQ(idle_cancels.load(), 1);
  EXPECT_EQ(busy_cancels.load(), 1);
}

TEST(StreamLimits, AStreamClosedByItsOwnCancelDoesNotDeadlock) {
  StreamLimits l(Small());
  std::unique_ptr<StreamLimits::Stream> s;
  s = *l.Open("ipv4:1.1.1.1:1", [&] { s.reset(); });  // OnDone run inline by TryCancel
  EXPECT_EQ(l.Sweep(absl::Now() + absl::Minutes(2)), 1);
  EXPECT_EQ(l.open_streams(), 0);
}

TEST(PeerHost, DropsThePort) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.1:5000"), "ipv4:10.0.0.1");
  EXPECT_EQ(PeerHost("ipv6:[::1]:5000"), "ipv6:[::1]");
  EXPECT_EQ(PeerHost("unix:/tmp/x"), "unix:/tmp/x");
}

}  // namespace
}  // namespace tern
