// The table of commands against the flags the command files define, without starting anything:
// every command's flags exist, have help and (numbers) a range; every flag of tern's is some
// command's; and a flag defined in a command's group file is that command's with nothing else to
// list.
#include "cli/command_table.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/recipe_flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(tern::Int<tern::AtLeast(1)>, table_test_count, 1, "a flag of the test's own command");
ABSL_FLAG(int, table_test_plain, 1, "a number with no range");

namespace tern {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

int Nothing(const std::vector<std::string>&) { return 0; }

const CommandInfo& Find(const std::vector<CommandInfo>& table, const std::string& name) {
  return *std::find_if(table.begin(), table.end(),
                       [&](const CommandInfo& c) { return c.name == name; });
}

TEST(FlagTypes, ARangedFlagParsesOnlyNumbersInItsRangeAndSaysWhichRange) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag("table_test_count");
  ASSERT_NE(flag, nullptr);
  std::string error;
  EXPECT_TRUE(flag->ParseFrom("7", &error)) << error;
  EXPECT_EQ(absl::GetFlag(FLAGS_table_test_count).value, 7);
  EXPECT_FALSE(flag->ParseFrom("0", &error));
  EXPECT_THAT(error, HasSubstr("must be >= 1"));
  EXPECT_FALSE(flag->ParseFrom("2.5", &error));
  EXPECT_THAT(error, HasSubstr("not a whole number"));
  EXPECT_EQ(absl::GetFlag(FLAGS_table_test_count).value, 7);  // a refused value changes nothing
  EXPECT_EQ(In(1, 1 << 20).Says(), "in [1, 1048576]");
  EXPECT_EQ(HalfOpen(0, 1).Says(), "in [0, 1)");
  EXPECT_EQ(AboveUpTo(0, 1).Says(), "in (0, 1]");
  EXPECT_EQ(Above(0).Says(), "> 0");
  EXPECT_EQ(AtLeast(0.5).Says(), ">= 0.5");
  EXPECT_TRUE(HalfOpen(0, 1).Holds(0) && !HalfOpen(0, 1).Holds(1));
  EXPECT_TRUE(AboveUpTo(0, 1).Holds(1) && !AboveUpTo(0, 1).Holds(0));
}

TEST(CommandTable, EveryCommandsFlagsExistHaveHelpAndARangeAndEveryFlagIsACommands) {
  const absl::Status s = CheckTable(CommandTable());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(CommandTable, AFlagDefinedInAGroupFileIsThatCommandsWithNothingElseToList) {
  std::vector<CommandInfo> table = CommandTable();
  table.push_back(
      {.name = "test", .summary = "s", .groups = {"cli/command_table_test.cc"}, .run = Nothing});
  EXPECT_THAT(FlagsOf(table.back()), Contains("table_test_count"));
  // The real groups: training flags are the worker's and the run's, aggregator flags the
  // server's, and neither is the other's.
  EXPECT_THAT(FlagsOf(Find(table, "worker")), Contains("algorithm"));
  EXPECT_THAT(FlagsOf(Find(table, "run")), Contains("bucket_mb"));
  EXPECT_THAT(FlagsOf(Find(table, "worker")), Not(Contains("rounds")));
  EXPECT_THAT(FlagsOf(Find(table, "server")), Contains("rounds"));
  EXPECT_THAT(FlagsOf(Find(table, "server")), Not(Contains("clients")));
  EXPECT_THAT(FlagsOf(Find(table, "client")), Contains("clients"));
  // The shared files of clients/flags/: TLS is every serving or calling command's, a caller's
  // token a server's only as it calls a parent (--parent), the task's numbers the server's and
  // not a client's.
  for (const char* c : {"worker", "server", "client", "scheduler", "health"}) {
    EXPECT_THAT(FlagsOf(Find(table, c)), Contains("tls_ca")) << c;
  }
  EXPECT_THAT(FlagsOf(Find(table, "health")), Contains("token_file"));
  EXPECT_THAT(FlagsOf(Find(table, "server")), Contains("token_file"));
  EXPECT_THAT(FlagsOf(Find(table, "scheduler")), Not(Contains("token_file")));
  EXPECT_THAT(FlagsOf(Find(table, "server")), Contains("norm_guard"));
  EXPECT_THAT(FlagsOf(Find(table, "client")), Not(Contains("norm_guard")));
  EXPECT_THAT(FlagsOf(Find(table, "client")), Contains("partition"));
}

TEST(CommandTable, APlainNumberAMissingFlagAnEmptyGroupAndNothingToRunAreRefused) {
  const std::vector<std::pair<CommandInfo, std::string>> bad = {
      {{.name = "t", .summary = "s", .flags = {"table_test_plain"}, .run = Nothing},
       "--table_test_plain"},
      {{.name = "t", .summary = "s", .flags = {"no_such_flag"}, .run = Nothing},
       "--no_such_flag, which no flag defines"},
      {{.name = "t", .summary = "s", .groups = {"cli/no_such_file.cc"}, .run = Nothing},
       "cli/no_such_file.cc, which defines none"},
      {{.name = "t", .summary = "s", .flags = {"table_test_count"}}, "nothing to run"},
  };
  for (const auto& [command, says] : bad) {
    std::vector<CommandInfo> table = CommandTable();
    table.push_back(command);
    const absl::Status s = CheckTable(table);
    EXPECT_FALSE(s.ok()) << says;
    EXPECT_THAT(std::string(s.message()), HasSubstr(says));
  }
  const absl::Status plain = CheckTable([] {
    std::vector<CommandInfo> t = CommandTable();
    t.push_back({.name = "t", .summary = "s", .flags = {"table_test_plain"}, .run = Nothing});
    return t;
  }());
  EXPECT_THAT(std::string(plain.message()), HasSubstr("plain number"));
}

// A recipe is the workers' where the command runs gossiping peers, else an aggregator's.
TEST(Recipes, TheSideOfARecipeIsThePeersForTheCommandsThatRunThem) {
  std::map<std::string, bool> peers;
  for (const CommandInfo& c : CommandTable()) peers[c.name] = RunsPeers(c);
  EXPECT_TRUE(peers.at("run"));
  EXPECT_TRUE(peers.at("worker"));
  EXPECT_TRUE(peers.at("launch"));
  EXPECT_FALSE(peers.at("server"));
  EXPECT_FALSE(peers.at("run --mode=federated|local-sgd|ps"));
}

std::string FlagValue(const char* name) { return absl::FindCommandLineFlag(name)->CurrentValue(); }

void SetFlagTo(const char* name, const char* value) {
  std::string error;
  ASSERT_TRUE(absl::FindCommandLineFlag(name)->ParseFrom(value, &error)) << error;
}

TEST(Recipes, ARecipeFillsInTheFlagsLeftOutAndKeepsThoseGiven) {
  absl::FlagSaver saver;
  SetFlagTo("recipe", "sparseloco");
  SetFlagTo("codec", "int8");
  ASSERT_TRUE(ApplyRecipe(RecipeSide::kPeers, {"recipe", "codec"}).ok());
  EXPECT_EQ(FlagValue("algorithm"), "diloco");
  EXPECT_EQ(FlagValue("topology"), "complete");
  EXPECT_EQ(FlagValue("outer"), "sparseloco:lr=1,beta=0.95");
  EXPECT_EQ(FlagValue("codec"), "int8");  // given: the user's
}

TEST(Recipes, StreamingDilocoOverlapsTwoStepsInFourStridedFragments) {
  absl::FlagSaver saver;
  SetFlagTo("recipe", "streaming-diloco");
  ASSERT_TRUE(ApplyRecipe(RecipeSide::kPeers, {"recipe"}).ok());
  EXPECT_EQ(FlagValue("codec"), "fp4");
  EXPECT_EQ(FlagValue("fragments"), "4");
  EXPECT_EQ(FlagValue("fragment_cut"), "strided");
  EXPECT_EQ(FlagValue("overlap"), "true");
  EXPECT_EQ(FlagValue("overlap_steps"), "2");
  EXPECT_EQ(FlagValue("merge_alpha"), "0.5");
}

TEST(Recipes, StreamingSignsSendsThreeFragmentsInSignsOverlappingAKeptStep) {
  absl::FlagSaver saver;
  SetFlagTo("recipe", "streaming-signs");
  SetFlagTo("fragments", "4");
  ASSERT_TRUE(ApplyRecipe(RecipeSide::kPeers, {"recipe", "fragments"}).ok());
  EXPECT_EQ(FlagValue("algorithm"), "diloco");
  EXPECT_EQ(FlagValue("codec"), "sign");
  EXPECT_EQ(FlagValue("outer"), "nesterov:lr=1,momentum=0.3");
  EXPECT_EQ(FlagValue("overlap"), "true");
  EXPECT_EQ(FlagValue("keep_overlap"), "true");
  EXPECT_EQ(FlagValue("fragments"), "4");  // given: the user's
  EXPECT_FALSE(ApplyRecipe(RecipeSide::kAggregator, {"recipe"}).ok());
}

TEST(Recipes, AverageSignsAveragesTheWholeUpdateInSignsOverlappingAKeptStep) {
  absl::FlagSaver saver;
  SetFlagTo("recipe", "average-signs");
  ASSERT_TRUE(ApplyRecipe(RecipeSide::kPeers, {"recipe"}).ok());
  EXPECT_EQ(FlagValue("algorithm"), "diloco");
  EXPECT_EQ(FlagValue("topology"), "complete");
  EXPECT_EQ(FlagValue("outer"), "average");
  EXPECT_EQ(FlagValue("codec"), "sign");
  EXPECT_EQ(FlagValue("overlap"), "true");
  EXPECT_EQ(FlagValue("keep_overlap"), "true");
  EXPECT_FALSE(ApplyRecipe(RecipeSide::kAggregator, {"recipe"}).ok());
}

TEST(Recipes, AFlagTheRecipeCannotBeWithoutGivenOtherwiseIsRefusedAndChangesNothing) {
  absl::FlagSaver saver;
  SetFlagTo("recipe", "sparseloco");
  SetFlagTo("algorithm", "choco");
  const std::string outer = FlagValue("outer");
  const absl::Status s = ApplyRecipe(RecipeSide::kPeers, {"recipe", "algorithm"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("needs --algorithm=diloco, not choco"));
  EXPECT_EQ(FlagValue("outer"), outer);
  EXPECT_EQ(FlagValue("algorithm"), "choco");
}

TEST(Recipes, ThroughAnAggregatorSparseLoCoIsLocalSgdRoundsOfItsUpdates) {
  absl::FlagSaver saver;
  SetFlagTo("recipe", "sparseloco");
  ASSERT_TRUE(ApplyRecipe(RecipeSide::kAggregator, {"recipe"}).ok());
  EXPECT_EQ(FlagValue("mode"), "local-sgd");
  EXPECT_EQ(FlagValue("outer"), "sparseloco:lr=1,beta=0.95");
  EXPECT_EQ(FlagValue("update_codec"), "chunk-topk:chunk=4096,k=64,bits=2");
}

TEST(Recipes, AnUnknownRecipeOrOneTheSideDoesNotRunIsRefused) {
  absl::FlagSaver saver;
  SetFlagTo("recipe", "demo");
  absl::Status s = ApplyRecipe(RecipeSide::kPeers, {"recipe"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("diloco, streaming-diloco, sparseloco"));
  SetFlagTo("recipe", "streaming-diloco");
  s = ApplyRecipe(RecipeSide::kAggregator, {"recipe"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("among the workers only"));
}

TEST(Recipes, EveryRecipesValuesParseIntoTheirFlags) {
  absl::FlagSaver saver;
  for (const Recipe& r : Recipes()) {
    for (const auto* side : {&r.peers, &r.aggregator}) {
      for (const RecipeFlag& f : *side) {
        absl::CommandLineFlag* flag = absl::FindCommandLineFlag(f.name);
        ASSERT_NE(flag, nullptr) << r.name << ": --" << f.name;
        std::string error;
        EXPECT_TRUE(flag->ParseFrom(f.value, &error)) << r.name << ": " << error;
      }
    }
  }
}

}  // namespace
}  // namespace tern
