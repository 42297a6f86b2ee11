// The `tern` command line as a user meets it: help that lists each command's flags, a flag of
// another command or an unknown one refused with a pointer to the right one, values checked
// before anything starts (exit code 2, the flag named), and a version that says its build.
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tern/v1/tensor.pb.h"
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
  r.out = ReadText(log);
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
  const Result bench = Tern({"help", "bench"});  // its one subcommand
  EXPECT_EQ(bench.code, 0) << bench.out;
  EXPECT_THAT(bench.out, AllOf(HasSubstr("usage: tern bench codecs"), HasSubstr("--sizes")));
}

TEST(Cli, AFlagOfTheOtherModesWorkIsAnErrorBeforeAnythingStarts) {
  // ps takes one minibatch gradient a round: the adaptive batch size is local work's.
  const Result ps = Tern({"run", "--mode=ps", "--adaptive_batch_eta=0.5", "--rounds=2"});
  EXPECT_EQ(ps.code, 2) << ps.out;
  EXPECT_THAT(ps.out, HasSubstr("--adaptive_batch_eta is for local work"));
  const Result fed = Tern({"run", "--mode=federated", "--optimizer=adam", "--rounds=2"});
  EXPECT_EQ(fed.code, 2) << fed.out;
  EXPECT_THAT(fed.out, HasSubstr("--optimizer=adam needs --mode=ps"));
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
                                               {"scheduler", "--heartbeat_interval_ms=0"},
                                               {"run", "--partition=bogus"},
                                               {"server", "--staleness_decay=2"},
                                               {"worker", "--id=-2"}}) {
    const Result r = Tern(args);
    EXPECT_EQ(r.code, 2) << args[1] << ": " << r.out;
    const std::string flag = args.back().substr(0, args.back().find('='));
    EXPECT_THAT(r.out, HasSubstr(flag)) << r.out;
    // Refused before binding or spawning: nothing was started, so nothing logged a port.
    EXPECT_THAT(r.out, Not(HasSubstr("port")));
  }
  // "--name value" is checked the same way, a negative value included.
  const Result spaced = Tern({"run", "--lr", "-0.1"});
  EXPECT_EQ(spaced.code, 2);
  EXPECT_THAT(spaced.out, HasSubstr("--lr=-0.1: must be >= 0"));
  const Result unknown = Tern({"frobnicate"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.out, HasSubstr("unknown command 'frobnicate'"));
}

// What a daemon would otherwise find only after it bound its port (or never): a port past 65535,
// a mode of the other kind of run, more replies than a round has clients, a checkpoint it cannot
// write, a model, partition or data directory the trainer cannot use, peers that do not match
// the workers. Each is a usage error, exit 2, before anything binds.
TEST(Cli, EveryDaemonRefusesWhatItCannotRunWithBeforeBindingWithExitTwo) {
  const std::vector<std::vector<std::string>> bad = {
      {"server", "--listen=127.0.0.1:99999"},
      {"server", "--mode=gossip"},
      {"server", "--min_replies=50", "--clients_per_round=10"},
      {"server", "--checkpoint=/nonexistent/dir/ckpt"},
      {"server", "--metrics_listen=nohost"},
      {"scheduler", "--max_waiting_calls=-1"},
      {"scheduler", "--listen=127.0.0.1:99999"},
      {"worker", "--listen=nonsense"},
      {"worker", "--model=mlp:hidden=0x"},
      {"worker", "--partition=dirichlet:alpha=-1"},
      {"worker", "--data=/nonexistent"},
      {"worker", "--peers=127.0.0.1:1,127.0.0.1:2", "--workers=3"},
      {"worker", "--id=3", "--workers=3"},
      {"worker", "--scheduler=127.0.0.1:1", "--listen=0.0.0.0:0"},
      {"worker", "--trainer=external", "--cpu_policy=realtime"},
      {"client", "--server=127.0.0.1:1", "--model=foo"},
      {"run", "--data=/nonexistent"},
      {"run", "--mode=federated", "--model=foo"},
  };
  for (const std::vector<std::string>& args : bad) {
    const Result r = Tern(args);
    EXPECT_EQ(r.code, 2) << args[1] << ": " << r.out;
    const std::string flag = args.back().substr(0, args.back().find('='));
    EXPECT_THAT(r.out, HasSubstr(flag)) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("on port"))) << r.out;  // what a daemon serving says
  }
}

// --check_flags says "good" only of flags the command itself would start with: it runs the same
// checks, so a value the run refuses is refused here with the same message and exit code.
TEST(Cli, CheckFlagsRefusesWhatTheRunRefuses) {
  const std::vector<std::vector<std::string>> bad = {
      {"run", "--algorithm=adam"},
      {"run", "--codec=zip"},
      {"run", "--mode=federatd"},
      {"run", "stray"},
      {"worker", "--algorithm=adam"},
      {"worker", "--trainer=gpu"},
      {"worker", "--cpu_policy=fast"},
      {"server", "--update_codec=zip"},
      {"server", "--rule=medoid"},
      {"client", "--server=h:1", "--clients=1", "--first_client=3"},
      {"scheduler", "--topology=hypercube9"},
  };
  for (const std::vector<std::string>& args : bad) {
    const Result run = Tern(args);
    std::vector<std::string> checked = args;
    checked.push_back("--check_flags");
    const Result check = Tern(checked);
    EXPECT_EQ(check.code, 2) << args[1] << ": " << check.out;
    EXPECT_EQ(run.code, 2) << args[1] << ": " << run.out;
    EXPECT_THAT(check.out, Not(HasSubstr("the flags are good"))) << args[1];
    // The check's message is the run's (each names the flag or argument at fault).
    const std::string first_line = check.out.substr(0, check.out.find('\n'));
    const std::string what = first_line.substr(first_line.rfind(": ") + 2);
    EXPECT_THAT(run.out, HasSubstr(what)) << args[1] << ": " << first_line;
  }
  const Result good = Tern({"run", "--algorithm=choco", "--codec=fp16", "--check_flags"});
  EXPECT_EQ(good.code, 0) << good.out;
  EXPECT_THAT(good.out, HasSubstr("the flags are good"));
}

// A --flagfile's flags meet the same checks as the command line's, before anything starts: a
// value out of its range, an unknown flag, a flag of another command (in a flagfile it names too).
TEST(Cli, AFlagfilesValuesAreCheckedAsTheCommandLinesAre) {
  const std::string dir = MakeTempDir();
  const auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    WriteText(path, text);
    return "--flagfile=" + path;
  };
  const std::string range = write("range.flags", "# a comment\n--workers=300\n");
  const std::string typo = write("typo.flags", "--workerz=3\n");
  const std::string other = write("other.flags", "--rounds=3\n");
  const std::string nested = write("nested.flags", range + "\n");
  for (const auto& [flagfile, says] : std::vector<std::pair<std::string, std::string>>{
           {range, "--workers=300: must be in [1, 256]"},
           {typo, "unknown flag --workerz; did you mean --workers?"},
           {other, "--rounds is not a flag of 'tern worker'"},
           {nested, "--workers=300: must be in [1, 256]"}}) {
    const Result r = Tern({"worker", flagfile, "--check_flags"});
    EXPECT_EQ(r.code, 2) << flagfile << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr(says)) << flagfile;
  }
  const Result good = Tern({"worker", write("good.flags", "--workers=4\n--id=1\n"),
                            "--peers=a:1,b:2,c:3,d:4", "--check_flags"});
  EXPECT_EQ(good.code, 0) << good.out;
}

// A client process whose clients are not the first of the run needs --partitions: the error says
// which flag (docs/deploy.md's line gives it).
TEST(Cli, AClientPastTheDefaultPartitionsIsToldToGivePartitions) {
  const Result r = Tern({"client", "--server=h:1", "--clients=1", "--first_client=3"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, AllOf(HasSubstr("--partitions=K"), HasSubstr("K >= 4")));
  const Result ok = Tern({"client", "--server=h:1", "--clients=1", "--first_client=3",
                          "--partitions=4", "--check_flags"});
  EXPECT_EQ(ok.code, 0) << ok.out;
}

TEST(Cli, ALossyCodecIsRefusedForAnAlgorithmThatCannotCompensateIt) {
  const Result r = Tern({"run", "--codec=topk:ratio=0.01"});  // the default algorithm: decentlam
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, AllOf(HasSubstr("decentlam"), HasSubstr("topk:ratio=0.01"),
                           HasSubstr("--algorithm=choco")));
}

// A lone worker (no peers) trains on its own: the round log grows while it runs, and with
// --exit_after_training it writes the final model before it exits.
TEST(Cli, AWorkerFlushesItsRoundLogAndWritesItsFinalModelBeforeExiting) {
  const std::string dir = MakeTempDir();
  const std::vector<std::string> common = {
      "worker",          "--workers=1",          "--epochs=1",      "--batch=512",
      "--model=softmax", "--listen=127.0.0.1:0", "--log_level=warn"};
  std::vector<std::string> serving = common;
  serving.push_back("--round_log=" + dir + "/rounds.jsonl");
  const pid_t pid = Spawn(serving, dir + "/serving.log");
  // 60000 / 512 = 118 steps; the worker keeps serving afterwards, so the lines are there only
  // if they were flushed as they were written.
  size_t lines = 0;
  for (int i = 0; i < 600 && lines < 118; ++i) {
    usleep(100 * 1000);
    lines = Lines(dir + "/rounds.jsonl").size();
  }
  EXPECT_EQ(lines, 118u) << ReadText(dir + "/serving.log");
  kill(pid, SIGTERM);
  EXPECT_EQ(Wait(pid), 0);

  std::vector<std::string> once = common;
  once.push_back("--exit_after_training");
  once.push_back("--final_model=" + dir + "/model.pb");
  const int code = Wait(Spawn(once, dir + "/once.log"));
  EXPECT_EQ(code, 0) << ReadText(dir + "/once.log");
  v1::TensorBundle model;
  ASSERT_TRUE(model.ParseFromString(ReadText(dir + "/model.pb"))) << ReadText(dir + "/once.log");
  ASSERT_EQ(model.tensors_size(), 2);  // softmax: weight [784, 10], bias [10]
  uint64_t numel = 0;
  for (const v1::NamedTensor& t : model.tensors()) {
    EXPECT_EQ(t.tensor().codec(), "none.v1");
    EXPECT_EQ(t.tensor().payload().size(), 4 * t.tensor().numel());
    numel += t.tensor().numel();
  }
  EXPECT_EQ(numel, 784u * 10 + 10);
}

TEST(Cli, AClientOfADeadServerSaysItCannotReachItWhileItRetries) {
  const std::string dir = MakeTempDir();
  // Port 1 on loopback: nothing listens there, connections are refused at once.
  const pid_t pid = Spawn({"client", "--server=127.0.0.1:1", "--clients=1", "--model=softmax"},
                          dir + "/client.log");
  std::string log;
  for (int i = 0; i < 300 && log.find("cannot reach") == std::string::npos; ++i) {
    usleep(100 * 1000);
    log = ReadText(dir + "/client.log");
  }
  EXPECT_THAT(log, AllOf(HasSubstr("cannot reach 127.0.0.1:1 ("), HasSubstr("retrying")));
  kill(pid, SIGTERM);
  Wait(pid);
}

TEST(Cli, VersionSaysTheBuildTypeAndTheBlasKernels) {
  for (const char* how : {"version", "--version"}) {
    const Result r = Tern({how});
    EXPECT_EQ(r.code, 0);
    EXPECT_THAT(r.out, HasSubstr(std::string("(wire format tern.v1, ") + TERN_BUILD_TYPE));
    EXPECT_THAT(r.out, Not(HasSubstr("NDEBUG")));
    EXPECT_THAT(r.out, HasSubstr("OpenBLAS kernels: "));
  }
}

// The transport bench as a user runs it: a 9.6 MB message (over 8 MiB: striped over two
// connections) and the same over one stream, both taken whole by a live worker.
TEST(Cli, BenchTransportPushesAStripedAndAOneStreamMessageAndPrintsTheirRatios) {
  const Result r = Tern({"bench", "transport", "--sizes=2400000", "--repeats=1"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--push_stripes=2"));
  EXPECT_THAT(r.out, HasSubstr("1s/tcp"));
  EXPECT_THAT(r.out, HasSubstr("    9.6 MB"));
}

}  // namespace
}  // namespace tern
