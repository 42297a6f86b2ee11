// tern — command-line entry point (commands and their flags: cli/command_table.cc). Subcommands:
//   tern run [--workers=8 --epochs=5 --algorithm=decentlam ...]   the main job
//   tern worker --id=I --workers=N --peers=... [training flags]   the peer daemon
//   tern report RUN_DIR... [--out=FILE]                            compare runs in one page
//   tern bench codecs [--sizes=1M,16M] [--codecs=a,b] [--threads=N] [--json=FILE]
//   tern bench transport [--sizes=256K,1M,4M,16M] [--repeats=5]
//   tern bench model [--model=mlp:hidden=1024x1024 --batch=64 --compute_threads=1]
//   tern codecs                 list codecs and their wire names
//   tern version
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "cli/bench_codecs.h"
#include "cli/bench_model.h"
#include "cli/bench_transport.h"
#include "cli/command_table.h"
#include "cli/commands.h"
#include "cli/flag_types.h"
#include "cli/train_flags.h"
#include "cli/worker_flags.h"
#include "common/allocator.h"
#include "common/logging.h"
#include "core/rpc/grpc_log.h"
#include "core/workload/blas_core.h"
#include "kernels/builtin.h"

ABSL_FLAG(std::string, sizes, "1M,16M", "bench: tensor sizes in floats (K/M suffixes)");
ABSL_FLAG(std::string, codecs, "", "bench: comma-separated codec specs; '' = all codecs");
ABSL_FLAG(tern::Int<tern::In(1, 1024)>, threads, 1,
          "bench: threads per encode/decode (targets are for 1)");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, min_time, 0.2, "bench: minimum seconds per measurement");
ABSL_FLAG(tern::Int<tern::In(1, 210)>, repeats, 5, "bench transport: timed pushes per size");
ABSL_FLAG(bool, tls, false,
          "run: mutual TLS between every process of the run (certificates made for it in the run "
          "folder, certs/); bench transport: also push through a receiver with mutual TLS");
ABSL_FLAG(std::string, json, "", "bench: also write results as JSON lines to this file");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error|off");
ABSL_FLAG(bool, check_flags, false,
          "check the command's flags (a --flagfile's too) as it would before starting, say so, "
          "and exit: 0 when they are good, 2 when not");

namespace {

bool ParseSize(absl::string_view s, uint64_t* out) {
  uint64_t mult = 1;
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) mult = 1 << 20;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) mult = 1 << 10;
  if (mult != 1) s.remove_suffix(1);
  uint64_t v;
  if (!absl::SimpleAtoi(s, &v) || v == 0) return false;
  *out = v * mult;
  return true;
}

// --sizes as element counts, or an error naming the bad entry.
absl::StatusOr<std::vector<uint64_t>> SizesFlag() {
  std::vector<uint64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    uint64_t n;
    if (!ParseSize(s, &n))
      return absl::InvalidArgumentError(absl::StrCat("bad --sizes entry '", s, "'"));
    sizes.push_back(n);
  }
  return sizes;
}

// Splits "topk:ratio=0.01,dgc:ratio=0.001,sample=0.02" into specs: a piece without ':' that holds
// '=' continues the previous spec's parameter list.
std::vector<std::string> SplitSpecs(absl::string_view list) {
  std::vector<std::string> specs;
  for (absl::string_view piece : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    if (!specs.empty() && piece.find(':') == piece.npos && piece.find('=') != piece.npos) {
      absl::StrAppend(&specs.back(), ",", piece);
    } else {
      specs.emplace_back(piece);
    }
  }
  return specs;
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "tern: %s\n", msg.c_str());
  return 2;
}

// "tern 0.1.0 (wire format tern.v1, Release build)": the build type CMake configured.
std::string VersionString() {
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  return absl::StrCat("tern 0.1.0 (wire format tern.v1, ", TERN_BUILD_TYPE,
                      " build)\nOpenBLAS kernels: ", tern::BlasCoreName(),
                      set == nullptr ? "" : absl::StrCat(" (OPENBLAS_CORETYPE=", set, ")"));
}

// What each command of the table runs, and what it checks of its flags before it starts (also
// for --check_flags). `args`: the words after the command.
struct Runner {
  const char* command;      // CommandInfo::name
  absl::Status (*check)();  // null: the table's names and ranges are all there is to check
  int (*run)(const std::vector<std::string>& args);
  bool takes_arguments = false;
};

std::string SelfExe() {
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  return len <= 0 ? std::string() : std::string(exe, static_cast<size_t>(len));
}

int RunRun(const std::vector<std::string>&) {
  const std::string exe = SelfExe();
  if (exe.empty()) return Fail("cannot find the tern executable (/proc/self/exe)");
  return tern::RunMain(exe);
}

int RunCodecs(const std::vector<std::string>&) {
  auto registry = tern::NewBuiltinCodecRegistry();
  for (const std::string& name : registry->Names()) {
    auto codec = registry->Create(name);
    std::printf("%-16s %-20s default: %s\n", name.c_str(), std::string((*codec)->Name()).c_str(),
                (*codec)->Spec().c_str());
  }
  return 0;
}

int RunBenchCodecs(const std::vector<std::string>&) {
  tern::BenchCodecsOptions options;
  absl::StatusOr<std::vector<uint64_t>> sizes = SizesFlag();
  if (!sizes.ok()) return Fail(std::string(sizes.status().message()));
  options.sizes = *std::move(sizes);
  options.specs = SplitSpecs(absl::GetFlag(FLAGS_codecs));
  if (options.specs.empty()) options.specs = tern::DefaultBenchSpecs();
  options.threads = absl::GetFlag(FLAGS_threads).value;
  options.min_seconds = absl::GetFlag(FLAGS_min_time).value;
  options.json_path = absl::GetFlag(FLAGS_json);
  if (options.threads < 1) return Fail("--threads must be >= 1");
  if (auto s = tern::RunBenchCodecs(options); !s.ok()) return Fail(s.ToString());
  return 0;
}

int RunBenchTransport(const std::vector<std::string>&) {
  tern::BenchTransportOptions options;
  absl::StatusOr<std::vector<uint64_t>> sizes = SizesFlag();
  if (!sizes.ok()) return Fail(std::string(sizes.status().message()));
  options.sizes = *std::move(sizes);
  options.repeats = absl::GetFlag(FLAGS_repeats).value;
  options.tls = absl::GetFlag(FLAGS_tls);
  options.push_stripes = absl::GetFlag(FLAGS_push_stripes).value;
  if (auto s = tern::RunBenchTransport(options); !s.ok()) return Fail(s.ToString());
  return 0;
}

int RunBenchModel(const std::vector<std::string>&) {
  tern::BenchModelOptions options;
  options.model = tern::ModelFlag();
  options.batch = tern::BatchFlag();
  options.min_seconds = absl::GetFlag(FLAGS_min_time).value;
  if (auto s = tern::RunBenchModel(options, tern::ComputeThreadsFlag()); !s.ok()) {
    return Fail(s.ToString());
  }
  return 0;
}

int RunVersion(const std::vector<std::string>&) {
  std::printf("%s\n", VersionString().c_str());
  return 0;
}

template <int (*Main)()>
int NoArgs(const std::vector<std::string>&) {
  return Main();
}

const Runner kRunners[] = {
    {"run", tern::CheckRunFlags, RunRun},
    {"run --mode=federated|local-sgd|ps", tern::CheckRunFlags, RunRun},
    {"worker", tern::CheckWorkerFlags, NoArgs<tern::WorkerMain>},
    {"server", tern::CheckServerFlags, NoArgs<tern::ServerMain>},
    {"client", tern::CheckClientFlags, NoArgs<tern::ClientMain>},
    {"scheduler", tern::CheckSchedulerFlags, NoArgs<tern::SchedulerMain>},
    {"health", nullptr, NoArgs<tern::HealthMain>},
    {"certs", nullptr, NoArgs<tern::CertsMain>},
    {"tokens", nullptr, NoArgs<tern::TokensMain>},
    {"export", nullptr, NoArgs<tern::ExportMain>},
    {"report", nullptr, tern::ReportMain, /*takes_arguments=*/true},
    {"codecs", nullptr, RunCodecs},
    {"bench codecs", nullptr, RunBenchCodecs},
    {"bench transport", nullptr, RunBenchTransport},
    {"bench model", nullptr, RunBenchModel},
    {"version", nullptr, RunVersion},
};

const Runner* FindRunner(const std::string& command) {
  for (const Runner& r : kRunners) {
    if (command == r.command) return &r;
  }
  return nullptr;
}

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
  for (const tern::CommandInfo& c : table) {
    if (c.name != "help" && FindRunner(c.name) == nullptr) {  // help: answered before any run
      std::fprintf(stderr, "tern: the command '%s' has nothing to run\n", c.name.c_str());
      return 1;
    }
  }
  if (target.command.empty()) {
    std::printf("%s", tern::CommandsHelp(table).c_str());
    return 0;
  }
  const tern::CommandInfo* c = tern::FindCommand(table, target);
  if (c == nullptr) return Fail(absl::StrCat("unknown command '", target.command, "'"));
  std::printf("%s", tern::CommandHelp(*c).c_str());
  return 0;
}

// Everything about the command line that can be wrong, before anything starts or binds.
absl::Status CheckCommandLine(const std::vector<tern::CommandInfo>& table,
                              const tern::CommandInfo* command, const tern::CommandLine& line) {
  if (absl::Status s = tern::CheckFlagNames(table, command, line.flag_names); !s.ok()) return s;
  if (const Runner* r = FindRunner(command->name);
      r != nullptr && !r->takes_arguments && !line.positional.empty()) {
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
  usage.version_string = VersionString;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(tern::CommandsHelp(table));
  if (line.version) return RunVersion({});
  if (line.help || line.command == "help") return Help(table, line);
  if (line.command.empty()) return Fail(tern::CommandsHelp(table));
  const tern::CommandInfo* command = tern::FindCommand(table, line);
  if (command == nullptr) {
    return Fail(absl::StrCat("unknown command '", line.command, "'\n", tern::CommandsHelp(table)));
  }
  if (absl::Status s = CheckCommandLine(table, command, line); !s.ok()) {
    return Fail(absl::StrCat(command->name, ": ", s.message()));
  }
  (void)absl::ParseCommandLine(argc, argv);  // the words after the command: line.positional
  // A flagfile's flags are checked only now that they are read.
  if (absl::Status s = tern::CheckFlagNames(table, command, tern::SpecifiedFlagNames()); !s.ok()) {
    return Fail(absl::StrCat(command->name, ": ", s.message()));
  }
  if (auto s = tern::InitLogging(absl::GetFlag(FLAGS_log_level)); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  tern::RouteGrpcLogs();
  const Runner* runner = FindRunner(command->name);
  if (runner == nullptr) return Fail(absl::StrCat("'", command->name, "' has nothing to run"));
  if (absl::GetFlag(FLAGS_check_flags)) {
    if (runner->check != nullptr) {
      if (absl::Status s = runner->check(); !s.ok()) {
        return Fail(absl::StrCat(command->name, ": ", s.message()));
      }
    }
    std::printf("tern %s: the flags are good\n", command->name.c_str());
    return 0;
  }
  tern::ApplyComputeThreads();
  return runner->run(line.positional);
}
