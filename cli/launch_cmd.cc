// `tern launch`: one worker beside the user's training script on each host, started by the same
// command everywhere, as torchrun's:
//
//   tern launch --rdzv=HOST:PORT --nnodes=3 [worker flags] -- python3 train.py ARGS...
//   tern launch --rdzv=HOST:PORT --nnodes=2:4 ...   (elastic: starts with 2, admits up to 4)
//
// The launcher that can bind HOST:PORT (the host it names; the first there) serves the run's
// rendezvous, a tern scheduler, in its own process; the others find it there. Each launcher
// starts `tern worker --trainer=external --scheduler=HOST:PORT --workers=N` (for MIN:MAX,
// --min_workers=MIN --max_workers=MAX: a host launched later joins with the group's state), its id
// from
// --node_rank or else the lowest the rendezvous has free, listening on the address this host
// reaches HOST by; then the script with TERN_WORKER=that address, where the Python package's
// DistributedOptimizer finds its worker. It ends with the script's exit status and stops the
// worker; a worker that dies stops the script (SIGTERM) and the launch fails (exit 1). The
// launcher serving the rendezvous goes on serving until the last member has left.
#include <netdb.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/command_table.h"
#include "cli/commands.h"
#include "cli/process.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/service_flags.h"
#include "clients/flags/worker_flags.h"
#include "common/status_macros.h"
#include "core/rpc/address.h"
#include "server/scheduler_service.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, rdzv, "",
          "launch: HOST:PORT of the run's rendezvous (a tern scheduler); the launcher that can "
          "bind it serves it");
ABSL_FLAG(std::string, nnodes, "",
          "launch: hosts in the run, one worker each: N, or MIN:MAX for a run that starts with "
          "MIN and admits hosts up to MAX while it runs (each joining with the group's state)");
ABSL_FLAG(tern::Int<tern::In(-1, 255)>, node_rank, -1,
          "launch: this host's worker id; -1: the rendezvous assigns the lowest free one (0 "
          "serves the rendezvous)");

namespace tern {
namespace {

// The worker's flags that `tern launch` sets itself.
constexpr const char* kSetByLaunch[] = {"id",          "workers",    "min_workers",
                                        "max_workers", "scheduler",  "trainer",
                                        "peers",       "peers_file", "port_file"};
// Flags of the launcher alone, and the command line's own. --recipe is applied here already and
// its flags go on as values: passed on too, it would set again on the worker a flag given here
// at its default value (which is not forwarded), overriding what the user chose.
constexpr const char* kNotForwarded[] = {"rdzv",     "nnodes",      "node_rank",
                                         "flagfile", "check_flags", "recipe"};

bool In(const std::string& name, absl::Span<const char* const> names) {
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

// --nnodes: N, or MIN:MAX (an elastic run).
struct NodeCount {
  int min = 0, max = 0;
  bool elastic() const { return min != max; }
};

absl::StatusOr<NodeCount> Nodes() {
  const std::string nnodes = absl::GetFlag(FLAGS_nnodes);
  const size_t colon = nnodes.find(':');
  NodeCount n;
  const bool parsed = colon == std::string::npos
                          ? absl::SimpleAtoi(nnodes, &n.min) && absl::SimpleAtoi(nnodes, &n.max)
                          : absl::SimpleAtoi(nnodes.substr(0, colon), &n.min) &&
                                absl::SimpleAtoi(nnodes.substr(colon + 1), &n.max);
  if (!parsed || n.min < 1 || n.max > 256 || n.min > n.max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nnodes=", nnodes,
                     ": the number of hosts (1 to 256), one worker each, or MIN:MAX with "
                     "1 <= MIN <= MAX <= 256"));
  }
  return n;
}

// The address of this host's interface toward `at` (the route's source address, found by
// connecting a UDP socket, which sends nothing); IPv6 in brackets.
absl::StatusOr<std::string> LocalAddressToward(const HostPort& at) {
  TERN_ASSIGN_OR_RETURN(const std::vector<SocketAddress> found, Resolve(at, SOCK_DGRAM));
  for (const SocketAddress& a : found) {
    const int fd = socket(a.family(), SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    const bool ok = connect(fd, a.get(), a.length) == 0 &&
                    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    close(fd);
    if (ok) return IpText(reinterpret_cast<const sockaddr*>(&local));
  }
  return absl::UnavailableError(absl::StrCat("no route from this host to ", at.host));
}

// Whether a listening socket can be bound to `at` here (the host is this machine's and nothing
// serves the port): asked before starting the rendezvous, so that the launchers that cannot
// serve it say so in one line rather than through gRPC's bind error.
bool CanBind(const HostPort& at) {
  absl::StatusOr<std::vector<SocketAddress>> found = Resolve(at, SOCK_STREAM, AI_PASSIVE);
  if (!found.ok()) return false;
  for (const SocketAddress& a : *found) {
    const int fd = socket(a.family(), SOCK_STREAM, 0);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as gRPC binds
    const bool ok = bind(fd, a.get(), a.length) == 0;
    close(fd);
    if (ok) return true;
  }
  return false;
}

// The worker's command line: the launcher's own settings (`listen` the address it listens on),
// then every other worker flag given to `tern launch`, as given.
std::vector<std::string> WorkerArgs(NodeCount nodes, const std::string& listen,
                                    const std::string& port_file) {
  std::vector<std::string> args = {"worker", "--trainer=external",
                                   absl::StrCat("--scheduler=", absl::GetFlag(FLAGS_rdzv))};
  for (std::string& a : WorkerCountFlags(nodes.elastic(), nodes.min, nodes.max)) {
    args.push_back(std::move(a));
  }
  args.push_back(absl::StrCat("--port_file=", port_file));
  args.push_back(absl::StrCat("--listen=", listen));
  if (const int rank = absl::GetFlag(FLAGS_node_rank).value; rank >= 0) {
    args.push_back(absl::StrCat("--id=", rank));
  }
  for (const std::string& name : SpecifiedFlagNames()) {
    if (In(name, kNotForwarded) || name == "listen") continue;
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    args.push_back(absl::StrCat("--", name, "=", flag->CurrentValue()));
  }
  return args;
}

// fork + execvp of `command` (found on PATH) with the launcher's stdio and TERN_WORKER set.
pid_t StartScript(const std::vector<std::string>& command, const std::string& worker) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  setenv("TERN_WORKER", worker.c_str(), 1);
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "tern launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
  _exit(127);
}

// SIGTERM to `pid`, up to 15 s to end, then SIGKILL; its exit code (128 + signal when killed).
int StopScript(pid_t pid) {
  kill(pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 150; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    usleep(100000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return 128 + SIGKILL;
}

}  // namespace

absl::Status CheckLaunchFlags() {
  const std::string rdzv = absl::GetFlag(FLAGS_rdzv);
  if (rdzv.empty()) {
    return absl::InvalidArgumentError(
        "--rdzv=HOST:PORT is needed: where the run's rendezvous is (the same on every host)");
  }
  TERN_RETURN_IF_ERROR(CheckHostPort("rdzv", rdzv));
  TERN_ASSIGN_OR_RETURN(const NodeCount nodes, Nodes());
  if (const int rank = absl::GetFlag(FLAGS_node_rank).value; rank >= nodes.max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node_rank=", rank, " is not below ", nodes.max,
                     " (--nnodes=", absl::GetFlag(FLAGS_nnodes), "; ranks are 0-based)"));
  }
  for (const std::string& name : SpecifiedFlagNames()) {
    if (In(name, kSetByLaunch)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": tern launch sets it on its worker itself (from --rdzv, ",
                       "--nnodes and --node_rank)"));
    }
  }
  return absl::OkStatus();
}

int LaunchCommand(const std::vector<std::string>& command) {
  if (absl::Status s = CheckLaunchFlags(); !s.ok()) {
    std::fprintf(stderr, "tern launch: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (command.empty()) {
    std::fprintf(stderr,
                 "tern launch: the command to run goes after --, e.g. tern launch "
                 "--rdzv=HOST:PORT --nnodes=3 -- python3 train.py\n");
    return 2;
  }
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) {
    std::fprintf(stderr, "tern launch: cannot find the tern executable (/proc/self/exe)\n");
    return 2;
  }
  const std::string self_exe(exe, static_cast<size_t>(len));
  const NodeCount nodes = *Nodes();
  const int rank = absl::GetFlag(FLAGS_node_rank).value;
  const std::string rdzv = absl::GetFlag(FLAGS_rdzv);
  const HostPort at = SplitHostPort(rdzv);
  const volatile sig_atomic_t* interrupted = CatchInterrupts();

  // The rendezvous: here if this host can bind it (a daemon's port is never shared: the second
  // to bind it is refused), or wherever it is.
  std::unique_ptr<SchedulerServer> rendezvous;
  if (rank > 0 || (rank < 0 && !CanBind(at))) {
    spdlog::info("launch: the rendezvous at {} is served elsewhere (not bound here)", rdzv);
  } else {
    // This host's to serve, unless another launcher here bound it since; any other failure
    // (its TLS flags, say) is the launch's.
    absl::StatusOr<std::unique_ptr<SchedulerServer>> served = ServeRendezvous(rdzv);
    if (served.ok()) {
      rendezvous = *std::move(served);
      spdlog::info("launch: serving the rendezvous on {}", rdzv);
    } else if (rank < 0 && !CanBind(at)) {
      spdlog::info("launch: the rendezvous at {} is served by another launcher here", rdzv);
    } else {
      spdlog::error("launch: serving the rendezvous on {}: {}", rdzv, served.status().ToString());
      return 1;
    }
  }
  absl::StatusOr<std::string> local = LocalAddressToward(at);
  if (!local.ok()) {
    spdlog::error("launch: {}", local.status().ToString());
    return 1;
  }
  // The worker listens on --listen when given, else on this host's address toward the
  // rendezvous; its script reaches it there (loopback for a wildcard).
  const bool listen_given = absl::c_linear_search(SpecifiedFlagNames(), "listen");
  const std::string listen = listen_given ? absl::GetFlag(FLAGS_listen) : *local + ":0";
  std::string listen_host = listen.substr(0, listen.rfind(':'));
  if (listen_host.empty() || listen_host == "0.0.0.0" || listen_host == "[::]") {
    listen_host = "127.0.0.1";
  }
  char dir_template[] = "/tmp/tern-launch-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    spdlog::error("launch: cannot make a folder under /tmp: {}", std::strerror(errno));
    return 1;
  }
  const std::string dir = dir_template;
  ChildProcess worker;
  worker.log = dir + "/worker.log";
  const std::string port_file = dir + "/worker.port";
  const std::vector<std::string> args = WorkerArgs(nodes, listen, port_file);
  spdlog::info("launch: tern {} (log {})", absl::StrJoin(args, " "), worker.log);
  worker.pid = Spawn(self_exe, args, worker.log);
  worker.alive = worker.pid > 0;
  const double wait_s = absl::GetFlag(FLAGS_peers_timeout).value + 30;
  const int worker_port = WaitForPortFile(port_file, worker, wait_s, interrupted);
  int code = 0;
  if (worker_port <= 0) {
    spdlog::error("launch: the worker did not start: {}", FirstErrorLine(worker.log));
    code = 1;
  } else {
    const std::string address = absl::StrCat(listen_host, ":", worker_port);
    const pid_t script = StartScript(command, address);
    spdlog::info("launch: {} with TERN_WORKER={}", absl::StrJoin(command, " "), address);
    for (;;) {
      int status = 0;
      if (waitpid(script, &status, WNOHANG) == script) {
        code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (*interrupted) {
        code = StopScript(script);
        break;
      }
      if (Reap({&worker}, /*quiet=*/true) == 0) {
        spdlog::error("launch: the worker ended before the script: {}", FirstErrorLine(worker.log));
        StopScript(script);
        code = 1;
        break;
      }
      usleep(100000);
    }
  }
  StopAll({&worker});
  if (rendezvous != nullptr) {
    // The others' workers may still train: the rendezvous stays until the last has left (or
    // was declared dead).
    bool said = false;
    while (!*interrupted && rendezvous->membership().Members(absl::Now()).members_size() > 0) {
      if (!said) spdlog::info("launch: serving the rendezvous until every worker has left");
      said = true;
      usleep(200000);
    }
    rendezvous->Shutdown(absl::Seconds(1));
  }
  if (code == 0) {
    std::remove(worker.log.c_str());
    std::remove(port_file.c_str());
    rmdir(dir.c_str());
  } else {
    spdlog::info("launch: the worker's log is kept: {}", worker.log);
  }
  return code;
}

}  // namespace tern
