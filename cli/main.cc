// tern — command-line entry point: reads the command line, checks it against the command's record
// (cli/command_table.cc: its flags, checks and run function), and runs it. Subcommands:
//   tern run [--workers=8 --epochs=5 --algorithm=decentlam ...]   the main job
//   tern worker --id=I --workers=N --peers=... [training flags]   the peer daemon
//   tern report RUN_DIR... [--out=FILE]                            compare runs in one page
//   tern bench codecs [--sizes=1M,16M] [--codecs=a,b] [--threads=N] [--json=FILE]
//   tern bench transport [--sizes=256K,1M,4M,16M] [--repeats=5]
//   tern bench model [--model=mlp:hidden=1024x1024 --batch=64 --compute_threads=1]
//   tern codecs                 list codecs and their wire names
//   tern version
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cli/command_table.h"
#include "cli/commands.h"
#include "clients/flags/recipe_flags.h"
#include "clients/flags/train_flags.h"
#include "common/allocator.h"
#include "common/logging.h"
#include "core/rpc/grpc_log.h"
#include "core/workload/blas_core.h"

ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(bool, check_flags);

namespace {

// `tern help [COMMAND]` and `--help`: the commands, or one command's flags. Returns the exit code.
int Help(const std::vector<tern::CommandInfo>& table, const tern::CommandLine& line) {
  tern::CommandLine target = line;
  if (line.command == "help") {
    target.command = line.positional.empty() ? "" : line.positional[0];
    // `tern help bench model`; plain `tern help bench` means its first subcommand, codecs.
    if (target.command == "bench") {
      target.command =
          line.positional.size() > 1 ? absl::StrCat("bench ", line.positional[1]) : "bench codecs";
    }
  }
  if (absl::Status s = tern::CheckTable(table); !s.ok()) {
    std::fprintf(stderr, "tern: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (target.command.empty()) {
    std::printf("%s", tern::CommandsHelp(table).c_str());
    return 0;
  }
  const tern::CommandInfo* c = tern::FindCommand(table, target);
  if (c == nullptr) return tern::UsageError(absl::StrCat("unknown command '", target.command, "'"));
  std::printf("%s", tern::CommandHelp(*c).c_str());
  return 0;
}

// Everything about the command line that can be wrong, before anything starts or binds.
absl::Status CheckCommandLine(const std::vector<tern::CommandInfo>& table,
                              const tern::CommandInfo* command, const tern::CommandLine& line) {
  if (absl::Status s = tern::CheckFlagNames(table, command, line.flag_names); !s.ok()) return s;
  if (!command->takes_arguments && !line.positional.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", line.positional[0],
                                                   "': tern ", command->name,
                                                   " takes flags only (--name=value)"));
  }
  return tern::CheckValueSyntax(line);
}

}  // namespace

int main(int argc, char** argv) {
  tern::ChooseBlasCoreOrReexec(argv);
  tern::KeepFreedMemoryForReuse();
#ifdef NDEBUG
  // Debian's abseil tracks every Mutex for deadlock cycles; a daemon that makes a mutex per
  // call (a long poll, a stream) spends a tenth of its CPU there (perf, 10,000 clients). Debug
  // and sanitizer builds keep the check.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  const std::vector<tern::CommandInfo> table = tern::CommandTable();
  const tern::CommandLine line = tern::ScanCommandLine(argc, argv);
  absl::FlagsUsageConfig usage;
  usage.version_string = tern::VersionString;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(tern::CommandsHelp(table));
  if (line.version) return tern::VersionMain({});
  if (line.help || line.command == "help") return Help(table, line);
  if (line.command.empty()) return tern::UsageError(tern::CommandsHelp(table));
  const tern::CommandInfo* command = tern::FindCommand(table, line);
  if (command == nullptr) {
    return tern::UsageError(
        absl::StrCat("unknown command '", line.command, "'\n", tern::CommandsHelp(table)));
  }
  if (absl::Status s = CheckCommandLine(table, command, line); !s.ok()) {
    return tern::UsageError(absl::StrCat(command->name, ": ", s.message()));
  }
  (void)absl::ParseCommandLine(argc, argv);  // the words after the command: line.positional
  // A flagfile's flags are checked only now that they are read.
  if (absl::Status s = tern::CheckFlagNames(table, command, tern::SpecifiedFlagNames()); !s.ok()) {
    return tern::UsageError(absl::StrCat(command->name, ": ", s.message()));
  }
  // A recipe fills in the flags left out, for the workers or for an aggregator as the command is.
  const tern::RecipeSide side =
      tern::RunsPeers(*command) ? tern::RecipeSide::kPeers : tern::RecipeSide::kAggregator;
  if (absl::Status s = tern::ApplyRecipe(side, line.flag_names); !s.ok()) {
    return tern::UsageError(absl::StrCat(command->name, ": ", s.message()));
  }
  if (auto s = tern::InitLogging(absl::GetFlag(FLAGS_log_level)); !s.ok()) {
    return tern::UsageError(std::string(s.message()));
  }
  tern::RouteGrpcLogs();
  if (command->run == nullptr) {
    return tern::UsageError(absl::StrCat("'", command->name, "' has nothing to run"));
  }
  if (absl::GetFlag(FLAGS_check_flags)) {
    if (command->check != nullptr) {
      if (absl::Status s = command->check(); !s.ok()) {
        return tern::UsageError(absl::StrCat(command->name, ": ", s.message()));
      }
    }
    std::printf("tern %s: the flags are good\n", command->name.c_str());
    return 0;
  }
  tern::ApplyComputeThreads();
  return command->run(line.positional);
}
