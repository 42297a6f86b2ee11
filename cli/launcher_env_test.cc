#include "cli/launcher_env.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

absl::StatusOr<LauncherEnv> Read(const std::map<std::string, std::string>& vars) {
  return ReadLauncherEnv([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(LauncherEnv, TorchrunsVariablesGiveTheRankTheSizeAndTheRendezvousAboveMasterPort) {
  auto zero = Read({{"RANK", "0"},
                    {"WORLD_SIZE", "3"},
                    {"LOCAL_RANK", "0"},
                    {"MASTER_ADDR", "10.0.0.1"},
                    {"MASTER_PORT", "29500"}});
  ASSERT_THAT(zero, IsOk());
  EXPECT_EQ(zero->rank, 0);
  EXPECT_EQ(zero->world, 3);
  EXPECT_EQ(zero->scheduler, "10.0.0.1:29501");
  EXPECT_EQ(zero->serve_scheduler, "10.0.0.1:29501") << "rank 0 serves the rendezvous";
  auto two = Read(
      {{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  ASSERT_THAT(two, IsOk());
  EXPECT_EQ(two->scheduler, "10.0.0.1:29501");
  EXPECT_EQ(two->serve_scheduler, "");
}

TEST(LauncherEnv, SlurmAndMpiNameTheRankTooAndTernSchedulerNamesARendezvousNobodyServes) {
  auto slurm = Read({{"SLURM_PROCID", "1"},
                     {"SLURM_NTASKS", "4"},
                     {"TERN_SCHEDULER", "sched:7071"},
                     {"MASTER_ADDR", "h"},
                     {"MASTER_PORT", "1"}});
  ASSERT_THAT(slurm, IsOk());
  EXPECT_EQ(slurm->rank, 1);
  EXPECT_EQ(slurm->world, 4);
  EXPECT_EQ(slurm->scheduler, "sched:7071");
  EXPECT_EQ(slurm->serve_scheduler, "");
  auto mpi = Read({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  ASSERT_THAT(mpi, IsOk());
  EXPECT_EQ(mpi->rank, 3);
  EXPECT_TRUE(mpi->scheduler.empty());
  auto none = Read({});
  ASSERT_THAT(none, IsOk());
  EXPECT_FALSE(none->rank.has_value());
  EXPECT_FALSE(none->world.has_value());
  EXPECT_TRUE(none->said.empty());
}

TEST(LauncherEnv, ValuesOutOfRangeAreRefusedNamingTheVariable) {
  EXPECT_THAT(Read({{"RANK", "x"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RANK=x")));
  EXPECT_THAT(Read({{"WORLD_SIZE", "0"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("WORLD_SIZE=0")));
  EXPECT_THAT(Read({{"RANK", "3"}, {"WORLD_SIZE", "3"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not below")));
  EXPECT_THAT(Read({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "65535"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("MASTER_PORT=65535")));
}

}  // namespace
}  // namespace tern
