#include "common/cpu_policy.h"

#include <thread>

#include "gtest/gtest.h"

namespace tern {
namespace {

TEST(CpuPolicy, NamesParseBackToTheirPolicies) {
  for (CpuPolicy p : {CpuPolicy::kNormal, CpuPolicy::kBatch}) {
    auto parsed = ParseCpuPolicy(CpuPolicyName(p));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, p);
  }
}

TEST(CpuPolicy, AnUnknownNameIsRefusedWithTheChoices) {
  auto parsed = ParseCpuPolicy("realtime");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("'batch'"), std::string::npos);
}

// Run on a thread of its own, so the test binary's other threads keep their policy.
TEST(CpuPolicy, ThreadsStartedAfterTheChangeInheritIt) {
  CpuPolicy child = CpuPolicy::kNormal, after_reset = CpuPolicy::kBatch;
  absl::Status set, reset;
  std::thread outer([&] {
    set = SetThreadCpuPolicy(CpuPolicy::kBatch);
    std::thread inner([&] { child = ThreadCpuPolicy(); });
    inner.join();
    reset = SetThreadCpuPolicy(CpuPolicy::kNormal);
    after_reset = ThreadCpuPolicy();
  });
  outer.join();
  ASSERT_TRUE(set.ok()) << set;
  EXPECT_EQ(child, CpuPolicy::kBatch);
  ASSERT_TRUE(reset.ok()) << reset;
  EXPECT_EQ(after_reset, CpuPolicy::kNormal);
  EXPECT_EQ(ThreadCpuPolicy(), CpuPolicy::kNormal);  // this thread was never changed
}

}  // namespace
}  // namespace tern
