// Which flags each `tern` command takes, so that `tern help` and `tern <command> --help` list
// them, a flag meant for another command is an error naming that command, an unknown flag gets
// the nearest name suggested, and numeric values are range-checked before anything starts (each
// number's range is in its type, where the flag is defined: cli/flag_types.h).
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

struct CommandInfo {
  std::string name;     // "run", "bench codecs"; "run --mode=federated|local-sgd|ps" for a variant
  std::string summary;  // one line
  std::vector<std::string> flags;  // besides the common ones (--log_level, --flagfile)
};

// Every command and variant, in the order `tern help` lists them.
std::vector<CommandInfo> CommandTable();

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

// The table against the flags the binary defines: every listed flag exists, has help and, when
// it is a number, a range (or is marked as taking any value); and every flag of tern's own is
// listed for some command (`tern help` checks this, and a test runs it).
absl::Status CheckTable(const std::vector<CommandInfo>& table);

// Before parsing: each --name=value (a --flagfile's too) parses as its flag's type, which for a
// number includes its range (cli/flag_types.h); absl's parse would exit 1 on a bad one.
absl::Status CheckValueSyntax(const CommandLine& line);

// After parsing: the flags set on the command line or in a flagfile (to other than their
// defaults).
std::vector<std::string> SpecifiedFlagNames();

// The flag names of `candidates` nearest to `name` (edit distance), best first, at most 3.
std::vector<std::string> NearestNames(absl::string_view name,
                                      const std::vector<std::string>& candidates);

}  // namespace tern

#endif  // TERN_CLI_COMMAND_TABLE_H_
