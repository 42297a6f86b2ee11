// The `tern` command line as a user meets it: help that lists each command's flags, a flag of
// another command or an unknown one refused with a pointer to the right one, values checked
// before anything starts (exit code 2, the flag named), and a version that says its build.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/process_util.h"

namespace tern {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int code = -1;
  std::string out;  // stdout and stderr together
};

Result Tern(const std::vector<std::string>& args) {
  const std::string dir = MakeTempDir();
  const std::string log = dir + "/out.log";
  Result r;
  r.code = Wait(Spawn(args, log));
  r.out = ReadFile(log);
  return r;
}

TEST(Cli, HelpListsTheCommandsAndEachCommandsFlagsWithDefaults) {
  const Result all = Tern({"help"});
  EXPECT_EQ(all.code, 0) << all.out;
  for (const char* c : {"run", "worker", "server", "client", "scheduler", "bench codecs"}) {
    EXPECT_THAT(all.out, HasSubstr(c));
  }
  const Result worker = Tern({"worker", "--help"});
  EXPECT_EQ(worker.code, 0) << worker.out;
  EXPECT_THAT(worker.out, AllOf(HasSubstr("usage: tern worker"), HasSubstr("--peers"),
                                HasSubstr("--algorithm (default decentlam)"),
                                Not(HasSubstr("--heartbeat_timeout_ms"))));
  const Result scheduler = Tern({"help", "scheduler"});
  EXPECT_EQ(scheduler.code, 0);
  EXPECT_THAT(scheduler.out,
              AllOf(HasSubstr("--heartbeat_timeout_ms (default 5000)"), Not(HasSubstr("--codec"))));
  const Result fed = Tern({"run", "--mode=federated", "--help"});
  EXPECT_EQ(fed.code, 0);
  EXPECT_THAT(fed.out, AllOf(HasSubstr("--rounds"), HasSubstr("--clients_per_round"),
                             Not(HasSubstr("--topology"))));
}

TEST(Cli, AFlagOfAnotherCommandIsAnErrorNamingThatCommand) {
  const Result r = Tern({"scheduler", "--codec=foo", "--port_file=/nonexistent/port"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, AllOf(HasSubstr("--codec is not a flag of 'tern scheduler'"),
                           HasSubstr("tern run"), HasSubstr("tern worker")));
  const Result gossip_only = Tern({"run", "--mode=federated", "--topology=ring"});
  EXPECT_EQ(gossip_only.code, 2);
  EXPECT_THAT(gossip_only.out, HasSubstr("--topology is not a flag"));
}

TEST(Cli, AnUnknownFlagSuggestsTheNearestName) {
  const Result r = Tern({"run", "--lrr=0.1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("unknown flag --lrr; did you mean --lr?"));
  const Result bench = Tern({"bench", "codecs", "--min_tme=0.1"});
  EXPECT_EQ(bench.code, 2);
  EXPECT_THAT(bench.out, HasSubstr("did you mean --min_time?"));
}

TEST(Cli, BadValuesFailBeforeAnythingStartsWithTheFlagNamed) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"run", "--lr=-0.1"},
                                               {"run", "--batch=0"},
                                               {"run", "--lr=abc"},
                                               {"worker", "--momentum=1.5"},
                                               {"run", "--mode=ps", "--rounds=0"},
                                               {"scheduler", "--heartbeat_interval_ms=0"}}) {
    const Result r = Tern(args);
    EXPECT_EQ(r.code, 2) << args[1] << ": " << r.out;
    const std::string flag = args.back().substr(0, args.back().find('='));
    EXPECT_THAT(r.out, HasSubstr(flag)) << r.out;
    // Refused before binding or spawning: nothing was started, so nothing logged a port.
    EXPECT_THAT(r.out, Not(HasSubstr("port")));
  }
  const Result unknown = Tern({"frobnicate"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.out, HasSubstr("unknown command 'frobnicate'"));
}

TEST(Cli, VersionSaysTheBuildType) {
  for (const char* how : {"version", "--version"}) {
    const Result r = Tern({how});
    EXPECT_EQ(r.code, 0);
    EXPECT_THAT(r.out, HasSubstr(std::string("(wire format tern.v1, ") + TERN_BUILD_TYPE));
    EXPECT_THAT(r.out, Not(HasSubstr("NDEBUG")));
  }
}

}  // namespace
}  // namespace tern
