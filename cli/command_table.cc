#include "cli/command_table.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/commands.h"

ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error|off");
ABSL_FLAG(bool, check_flags, false,
          "check the command's flags (a --flagfile's too) as it would before starting, say so, "
          "and exit: 0 when they are good, 2 when not");

namespace tern {
namespace {

using Names = std::vector<std::string>;

// Flags every command takes: tern's own and absl's (--flagfile and friends).
bool IsCommonFlag(absl::string_view name) {
  static const char* const kCommon[] = {"log_level", "check_flags", "flagfile",
                                        "fromenv",   "tryfromenv",  "undefok"};
  for (const char* c : kCommon) {
    if (name == c) return true;
  }
  return false;
}

// Whether a flag defined in `file` (absl's Filename(): the path, its leading '/' dropped) is in
// one of `groups`, source files named from the repository's root.
bool InGroups(absl::string_view file, const Names& groups) {
  for (const std::string& g : groups) {
    if (file == g || absl::EndsWith(file, absl::StrCat("/", g))) return true;
  }
  return false;
}

// Numeric flags any value of which is good: no range to check.
constexpr const char* kAnyValue[] = {"seed", "step"};

bool IsNumeric(const absl::CommandLineFlag& flag) {
  return flag.IsOfType<int>() || flag.IsOfType<int64_t>() || flag.IsOfType<uint64_t>() ||
         flag.IsOfType<int32_t>() || flag.IsOfType<uint32_t>() || flag.IsOfType<double>() ||
         flag.IsOfType<float>();
}

bool TakesAnyValue(absl::string_view name) {
  for (const char* any : kAnyValue) {
    if (name == any) return true;
  }
  return false;
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Whether a flag was set (on the command line or in a flagfile) to other than its default;
// abseil 20220623 keeps IsSpecifiedOnCommandLine() private. A flag set to its default value
// counts as unset, which no check here minds.
bool IsSet(const absl::CommandLineFlag& flag) { return flag.CurrentValue() != flag.DefaultValue(); }

// "--name=value", "--name value", "-name" -> "name". absl's negated boolean "--noname" stays
// "noname": CheckFlagNames takes it as "name" when no flag is called "noname".
std::string FlagNameOf(absl::string_view arg) {
  while (absl::ConsumePrefix(&arg, "-")) {
  }
  return std::string(arg.substr(0, arg.find('=')));
}

}  // namespace

namespace {

template <int (*Main)()>
int NoArgs(const std::vector<std::string>&) {
  return Main();
}

// The flag files of clients/flags/ that several commands share, each one set of commands' flags.
constexpr char kRunFlags[] = "clients/flags/run_flags.cc";            // run_id, seed
constexpr char kTaskFlags[] = "clients/flags/task_flags.cc";          // batch, lr, ...
constexpr char kDataFlags[] = "clients/flags/data_flags.cc";          // model, data, partition
constexpr char kTopologyFlags[] = "clients/flags/topology_flags.cc";  // topology, weights
constexpr char kTrainFlags[] = "clients/flags/train_flags.cc";        // a gossip run's own
constexpr char kServiceFlags[] = "clients/flags/service_flags.cc";    // listen, metrics, tokens
constexpr char kTlsFlags[] = "clients/flags/tls_flags.cc";            // tls_cert, key, ca
constexpr char kCallerFlags[] = "clients/flags/caller_flags.cc";      // token_file
constexpr char kLimitFlags[] = "clients/flags/limit_flags.cc";        // incoming streams
constexpr char kRecipeFlags[] = "clients/flags/recipe_flags.cc";      // recipe

}  // namespace

bool RunsPeers(const CommandInfo& command) {
  return absl::c_linear_search(command.groups, kTrainFlags);
}

std::vector<CommandInfo> CommandTable() {
  return {
      {.name = "run",
       .summary = "start N workers on 127.0.0.1 with the built-in trainer (Fashion-MNIST), show "
                  "progress, write a run folder with metrics.jsonl and report.html",
       .groups = {"cli/run_cmd.cc", kRunFlags, kTaskFlags, kDataFlags, kTopologyFlags, kTrainFlags,
                  kRecipeFlags},
       .flags = {"mode", "out", "scheduler", "workers"},
       .check = CheckRunFlags,
       .run = RunCommand},
      {.name = "run --mode=federated|local-sgd|ps",
       .summary = "start an aggregator and N built-in clients on 127.0.0.1, with the same run "
                  "folder",
       .groups = {"cli/fed_run_cmd.cc", "cli/aggregator_flags.cc", kRunFlags, kTaskFlags,
                  kDataFlags, kRecipeFlags},
       .flags = {"attack", "attack_fraction", "client_delay_s", "clients", "name", "out", "tls"},
       .check = CheckRunFlags,
       .run = RunCommand},
      {.name = "worker",
       .summary = "the peer daemon: gossip and trainer services (--flagfile=FILE works)",
       .groups = {"clients/flags/worker_flags.cc", kRunFlags, kTaskFlags, kDataFlags,
                  kTopologyFlags, kTrainFlags, kServiceFlags, kTlsFlags, kCallerFlags, kLimitFlags,
                  kRecipeFlags},
       .check = CheckWorkerFlags,
       .run = NoArgs<WorkerMain>},
      {.name = "launch",
       .summary = "a worker beside your training script on this host, the same command on every "
                  "host: tern launch --rdzv=HOST:PORT --nnodes=N [worker flags] -- python3 "
                  "train.py",
       .groups = {"cli/launch_cmd.cc", "clients/flags/worker_flags.cc", kRunFlags, kTaskFlags,
                  kDataFlags, kTopologyFlags, kTrainFlags, kServiceFlags, kTlsFlags, kCallerFlags,
                  kLimitFlags, kRecipeFlags},
       .check = CheckLaunchFlags,
       .run = LaunchCommand,
       .takes_arguments = true},
      {.name = "server",
       .summary = "the aggregator daemon (federated, local-sgd, ps rounds; an edge of a parent "
                  "aggregator with --parent)",
       .groups = {"cli/aggregator_flags.cc", "cli/server_cmd.cc", kRunFlags, kTaskFlags,
                  kServiceFlags, kTlsFlags, kCallerFlags, kLimitFlags, kRecipeFlags},
       .check = CheckServerFlags,
       .run = NoArgs<ServerMain>},
      {.name = "client",
       .summary = "built-in clients of an aggregator (--server=HOST:PORT --clients=N)",
       .groups = {"cli/client_cmd.cc", kRunFlags, kDataFlags, kTlsFlags, kCallerFlags},
       .check = CheckClientFlags,
       .run = NoArgs<ClientMain>},
      {.name = "scheduler",
       .summary = "optional membership service: registration, heartbeats, failure detection, "
                  "barriers, gossip neighbours (workers: --scheduler=HOST:PORT)",
       .groups = {"cli/scheduler_cmd.cc", kTopologyFlags, kServiceFlags, kTlsFlags},
       .flags = {"run_id"},  // not --seed: a random-matching graph's seed is in --topology's spec
       .check = CheckSchedulerFlags,
       .run = NoArgs<SchedulerMain>},
      {.name = "health",
       .summary = "ask a daemon's gRPC health service (exit 0: SERVING, 1: not, 2: unreachable), "
                  "e.g. as a container health check",
       .groups = {"cli/health_cmd.cc", kTlsFlags, kCallerFlags},
       .run = NoArgs<HealthMain>},
      {.name = "certs",
       .summary = "make a development CA and a certificate per holder for TLS (openssl): "
                  "--out=DIR --names=server,worker-0,...",
       .groups = {"cli/certs_cmd.cc"},
       .flags = {"out"},
       .run = NoArgs<CertsMain>},
      {.name = "tokens",
       .summary = "make a bearer token per holder (DIR/NAME.token, for --token_file) and the "
                  "server's tokens file of their digests (DIR/tokens, for --tokens): --out=DIR "
                  "--names=client-0,...",
       .flags = {"names", "out"},
       .run = NoArgs<TokensMain>},
      {.name = "export",
       .summary = "a model as NumPy's .npz or PyTorch's state_dict file: --from=RUN_FOLDER|"
                  "MODEL_FILE|CHECKPOINT|SNAPSHOT_FOLDER --out=FILE.npz|FILE.pt",
       .groups = {"cli/export_cmd.cc"},
       .flags = {"out"},
       .run = NoArgs<ExportMain>},
      {.name = "report",
       .summary = "one HTML report comparing run folders: tern report DIR... --out=FILE",
       .flags = {"out"},
       .run = ReportMain,
       .takes_arguments = true},
      {.name = "bench codecs",
       .summary = "encode/decode throughput, compression and bits per coordinate of every codec, "
                  "against memcpy measured in the same run",
       .flags = {"sizes", "codecs", "threads", "min_time", "json"},
       .run = BenchCodecsMain},
      {.name = "bench transport",
       .summary = "one gossip message through the real Gossip.Push service on loopback against "
                  "raw TCP moving the same bytes in the same run (--sizes in fp32 values)",
       .flags = {"sizes", "repeats", "tls", "push_stripes"},
       .run = BenchTransportMain},
      {.name = "bench model",
       .summary = "one training step's compute of a built-in model (ms per step, one JSON line); "
                  "bench/model_step.py runs it beside PyTorch",
       .flags = {"model", "batch", "compute_threads", "min_time"},
       .run = BenchModelMain},
      {.name = "codecs", .summary = "list the codecs (spec name -> wire name)", .run = CodecsMain},
      {.name = "version", .summary = "print the version and build type", .run = VersionMain},
      {.name = "help", .summary = "tern help [COMMAND]: the commands, or one command's flags"},
  };
}

std::vector<std::string> FlagsOf(const CommandInfo& command) {
  Names names = command.flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (InGroups(flag->Filename(), command.groups)) names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

namespace {

// A --flagfile's --name=value lines, as arguments (comments and blank lines left out); none when
// it cannot be read (absl's parse then says so).
std::vector<std::string> FlagfileArgs(const std::string& path) {
  std::vector<std::string> args;
  std::ifstream in(path);
  std::string text;
  while (std::getline(in, text)) {
    const absl::string_view l = absl::StripAsciiWhitespace(text);
    if (absl::StartsWith(l, "-")) args.emplace_back(l);
  }
  return args;
}

void ScanFlagfiles(absl::string_view paths, int depth, CommandLine& line);

// Records one flag given on the command line (`depth` 0) or in a flagfile `depth` files deep: its
// name, its value when it has one, --mode's value, and a --flagfile's own flags in their turn.
void AddFlag(const std::string& name, const std::optional<std::string>& value, int depth,
             CommandLine& line) {
  line.flag_names.push_back(name);
  if (!value.has_value()) return;
  line.values.emplace_back(name, *value);
  if (name == "mode") line.mode = *value;
  if (name == "flagfile") ScanFlagfiles(*value, depth, line);
}

// Adds the flags of the --flagfile list `paths` to `line`, so that their names and values are
// checked before absl's parse (which exits 1 on a bad value) reads them again. Flagfiles they
// name are read in their turn, a few deep at most (one that names itself stops there).
void ScanFlagfiles(absl::string_view paths, int depth, CommandLine& line) {
  if (depth >= 8) return;
  for (absl::string_view path : absl::StrSplit(paths, ',', absl::SkipEmpty())) {
    for (const std::string& arg : FlagfileArgs(std::string(path))) {
      const size_t eq = arg.find('=');
      AddFlag(FlagNameOf(arg),
              eq == std::string::npos ? std::nullopt : std::optional(arg.substr(eq + 1)), depth + 1,
              line);
    }
  }
}

}  // namespace

CommandLine ScanCommandLine(int argc, char** argv) {
  CommandLine line;
  bool after_dashes = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (!after_dashes && arg == "--") {
      after_dashes = true;
    } else if (!after_dashes && absl::StartsWith(arg, "-") && arg.size() > 1) {
      const std::string name = FlagNameOf(arg);
      if (name == "help" || name == "h" || name == "helpfull" || name == "helpshort") {
        line.help = true;
      } else if (name == "version") {
        line.version = true;
      } else {
        std::optional<std::string> value;
        if (const size_t eq = arg.find('='); eq != absl::string_view::npos) {
          value = std::string(arg.substr(eq + 1));
        } else if (const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
                   f != nullptr && !f->IsOfType<bool>() && i + 1 < argc) {
          value = argv[++i];  // "--name value" (the value may start with '-': "--lr -0.1")
        }
        AddFlag(name, value, /*depth=*/0, line);
      }
    } else if (line.command.empty()) {
      line.command = std::string(arg);
    } else if (line.command == "bench" && line.positional.empty() &&
               (arg == "codecs" || arg == "model" || arg == "transport")) {
      line.command = absl::StrCat("bench ", arg);
    } else {
      line.positional.emplace_back(arg);
    }
  }
  return line;
}

const CommandInfo* FindCommand(const std::vector<CommandInfo>& table, const CommandLine& line) {
  std::string name = line.command;
  if (name == "run" && !line.mode.empty() && line.mode != "gossip") {
    name = "run --mode=federated|local-sgd|ps";
  }
  for (const CommandInfo& c : table) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string CommandsHelp(const std::vector<CommandInfo>& table) {
  std::string out = "usage: tern <command> [flags]\ncommands:\n";
  for (const CommandInfo& c : table) {
    absl::StrAppendFormat(&out, "  %s\n      %s\n", c.name, c.summary);
  }
  out += "'tern help COMMAND' or 'tern COMMAND --help' lists a command's flags.\n";
  return out;
}

std::string CommandHelp(const CommandInfo& command) {
  std::string out =
      absl::StrCat("usage: tern ", command.name, " [flags]\n  ", command.summary, "\nflags:\n");
  Names names = FlagsOf(command);
  names.push_back("log_level");
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    std::string def = flag->DefaultValue();
    if (def.empty()) def = "\"\"";
    absl::StrAppendFormat(&out, "  --%s (default %s)\n      %s\n", name, def, flag->Help());
  }
  out += "  --flagfile=FILE\n      read flags, one --name=value a line, from FILE\n";
  return out;
}

absl::Status CheckFlagNames(const std::vector<CommandInfo>& table, const CommandInfo* command,
                            const std::vector<std::string>& flag_names) {
  const Names mine = command != nullptr ? FlagsOf(*command) : Names();
  for (const std::string& given : flag_names) {
    std::string name = given;
    if (absl::FindCommandLineFlag(name) == nullptr && absl::StartsWith(name, "no") &&
        absl::FindCommandLineFlag(name.substr(2)) != nullptr) {
      name = name.substr(2);  // --noerror_feedback
    }
    if (IsCommonFlag(name)) continue;
    if (absl::FindCommandLineFlag(name) == nullptr) {
      Names candidates;
      for (const CommandInfo& c : table) {
        if (command == nullptr || &c == command) {
          const Names flags = FlagsOf(c);
          candidates.insert(candidates.end(), flags.begin(), flags.end());
        }
      }
      const Names near = NearestNames(name, candidates);
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag --", given,
          near.empty() ? "" : absl::StrCat("; did you mean --", absl::StrJoin(near, ", --"), "?")));
    }
    if (command == nullptr) continue;
    if (std::binary_search(mine.begin(), mine.end(), name)) continue;
    Names owners;
    for (const CommandInfo& c : table) {
      const Names flags = FlagsOf(c);
      if (std::binary_search(flags.begin(), flags.end(), name)) {
        owners.push_back(absl::StrCat("tern ", c.name));
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("--", name, " is not a flag of 'tern ",
                                                   command->name, "'; it belongs to ",
                                                   absl::StrJoin(owners, ", ")));
  }
  return absl::OkStatus();
}

absl::Status CheckTable(const std::vector<CommandInfo>& table) {
  std::set<std::string> listed;
  for (const CommandInfo& c : table) {
    if (c.run == nullptr && c.name != "help") {
      return absl::InternalError(absl::StrCat("'tern ", c.name, "' has nothing to run"));
    }
    for (const std::string& group : c.groups) {
      bool any = false;
      for (const auto& [name, flag] : absl::GetAllFlags())
        any = any || InGroups(flag->Filename(), {group});
      if (!any) {
        return absl::InternalError(
            absl::StrCat("'tern ", c.name, "' takes the flags of ", group, ", which defines none"));
      }
    }
    for (const std::string& name : FlagsOf(c)) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      if (flag == nullptr) {
        return absl::InternalError(
            absl::StrCat("'tern ", c.name, "' lists --", name, ", which no flag defines"));
      }
      if (flag->Help().empty()) {
        return absl::InternalError(absl::StrCat("--", name, " (", flag->Filename(),
                                                ") has no help: tern help would list it bare"));
      }
      if (IsNumeric(*flag) && !TakesAnyValue(name)) {
        return absl::InternalError(absl::StrCat(
            "--", name, " (", flag->Filename(),
            ") is a plain number: give it its range in its type (tern::Int<tern::AtLeast(1)>, "
            "clients/flags/flag_types.h), or list it in kAnyValue (cli/command_table.cc) if any "
            "value is good; else a bad value would start a daemon"));
      }
      listed.insert(name);
    }
  }
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    // absl's own flags, and a test's (command_table_test.cc's), are not tern's.
    const bool ours = !absl::StrContains(flag->Filename(), "absl/") &&
                      !absl::EndsWith(flag->Filename(), "_test.cc");
    if (ours && !IsCommonFlag(name) && listed.count(std::string(name)) == 0) {
      return absl::InternalError(
          absl::StrCat("--", name, " (", flag->Filename(),
                       ") belongs to no command: define it in a file a command takes (its "
                       "groups) or name it in a command's flags (cli/command_table.cc)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckValueSyntax(const CommandLine& line) {
  for (const auto& [name, value] : line.values) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr || name == "flagfile") continue;
    // Parse into the flag (as the full parse will again): the only public way to try a value.
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      // absl's "Illegal value 'V' specified for flag 'N'; " says again what the start says.
      absl::string_view why = error;
      if (absl::StartsWith(why, "Illegal value") && why.find("; ") != absl::string_view::npos) {
        why.remove_prefix(why.find("; ") + 2);
      }
      return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, ": ", why));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> SpecifiedFlagNames() {
  std::vector<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsSet(*flag)) names.emplace_back(name);
  }
  return names;
}

int UsageError(const std::string& msg) {
  std::fprintf(stderr, "tern: %s\n", msg.c_str());
  return 2;
}

std::vector<std::string> NearestNames(absl::string_view name, const Names& candidates) {
  std::vector<std::pair<size_t, std::string>> scored;
  std::set<std::string> seen;
  for (const std::string& c : candidates) {
    if (!seen.insert(c).second) continue;
    const size_t d = EditDistance(name, c);
    // Close enough to be a typo: within a third of the name, or a prefix of it.
    if (d <= std::max<size_t>(2, name.size() / 3) || absl::StartsWith(c, name)) {
      scored.emplace_back(d, c);
    }
  }
  std::sort(scored.begin(), scored.end());
  Names out;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) out.push_back(scored[i].second);
  return out;
}

}  // namespace tern
