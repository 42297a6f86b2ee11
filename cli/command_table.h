// Which flags each `tern` command takes, so that `tern help` and `tern <command> --help` list
// them, a flag meant for another command is an error naming that command, an unknown flag gets
// the nearest name suggested, and numeric values are range-checked before anything starts (each
// number's range is in its type, where the flag is defined: clients/flags/flag_types.h).
// The flags themselves stay absl flags, defined beside the code that reads them.
//
// Thread-safety: plain functions; call them from main before any other thread starts.
#ifndef TERN_CLI_COMMAND_TABLE_H_
#define TERN_CLI_COMMAND_TABLE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tern {

// One command: what `tern help` says of it, its flags, what it checks of them and what it runs.
// Its flags are every flag defined in the files `groups` names (each file of clients/flags/ is
// the flags of one set of commands: a flag added to clients/flags/tls_flags.cc is every command's
// that serves or calls, nowhere else to list it), and the flags `flags` names besides (one
// another command's file defines); never the common ones (--log_level, --flagfile,
// --check_flags).
struct CommandInfo {
  std::string name = {};  // "run", "bench codecs"; "run --mode=federated|local-sgd|ps": a variant
  std::string summary = {};              // one line
  std::vector<std::string> groups = {};  // files from the root: "cli/run_cmd.cc"
  std::vector<std::string> flags = {};   // single flags by name
  // What it checks of its flags beyond their names and ranges, before it starts anything (its
  // run makes the same checks) and for --check_flags; null: nothing more.
  absl::Status (*check)() = nullptr;
  // Runs it with `args`, the words after the command (none unless takes_arguments); returns the
  // exit code. Null only for `help`, which main answers itself.
  int (*run)(const std::vector<std::string>& args) = nullptr;
  bool takes_arguments = false;
};

// Whether `command` runs peers that gossip (it takes a gossip run's own flags), not clients of an
// aggregator or an aggregator: which side of a --recipe it takes.
bool RunsPeers(const CommandInfo& command);

// Every command and variant, in the order `tern help` lists them.
std::vector<CommandInfo> CommandTable();

// A command's flags: its groups' and its single ones, sorted.
std::vector<std::string> FlagsOf(const CommandInfo& command);

// What a command line asks for, read before the flags are parsed.
struct CommandLine {
  std::string command;  // "run", "bench codecs", "help", "" when none
  std::string mode;     // --mode's value when given
  bool help = false;    // --help / -h / --helpfull
  bool version = false;
  std::vector<std::string> flag_names;  // every --name[=value] given (in --flagfiles too)
  std::vector<std::pair<std::string, std::string>> values;  // the --name=value ones
  std::vector<std::string> positional;                      // the words after the command
};
CommandLine ScanCommandLine(int argc, char** argv);

// The table entry for a scanned command line (the run variant by --mode), or null.
const CommandInfo* FindCommand(const std::vector<CommandInfo>& table, const CommandLine& line);

// `tern help`: the commands and their summaries.
std::string CommandsHelp(const std::vector<CommandInfo>& table);
// `tern <command> --help`: usage, then each flag with its type, default and one-line help.
std::string CommandHelp(const CommandInfo& command);

// Before parsing: every flag named on the command line exists (else InvalidArgument with the
// nearest names) and belongs to `command` (else InvalidArgument naming the commands it belongs
// to). With no command, any flag of any command is accepted.
absl::Status CheckFlagNames(const std::vector<CommandInfo>& table, const CommandInfo* command,
                            const std::vector<std::string>& flag_names);

// The table against the flags the binary defines: every command has something to run (but
// help), every group names a file that defines flags, every single flag exists; each flag has
// help and, when it is a number, its range in its type (or is marked as taking any value); and
// every flag of tern's own belongs to some command. command_table_test.cc runs it.
absl::Status CheckTable(const std::vector<CommandInfo>& table);

// Before parsing: each --name=value (a --flagfile's too) parses as its flag's type, which for a
// number includes its range (clients/flags/flag_types.h); absl's parse would exit 1 on a bad one.
absl::Status CheckValueSyntax(const CommandLine& line);

// After parsing: the flags set on the command line or in a flagfile (to other than their
// defaults).
std::vector<std::string> SpecifiedFlagNames();

// Says "tern: <msg>" on stderr and returns 2, the exit code of a command line or flag at fault.
int UsageError(const std::string& msg);

// The flag names of `candidates` nearest to `name` (edit distance), best first, at most 3.
std::vector<std::string> NearestNames(absl::string_view name,
                                      const std::vector<std::string>& candidates);

}  // namespace tern

#endif  // TERN_CLI_COMMAND_TABLE_H_
