#include "cli/process.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tern {

pid_t Spawn(const std::string& exe, const std::vector<std::string>& args, const std::string& log) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(exe.c_str(), argv.data());
  _exit(127);
}

std::string Tail(const std::string& path, size_t bytes) {
  std::ifstream f(path);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return s.size() > bytes ? s.substr(s.size() - bytes) : s;
}

std::string FirstErrorLine(const std::string& path) {
  std::ifstream f(path);
  std::string line, last;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    // spdlog lines read "<time> E [pid] ..." (common/logging.cc); CLI errors "tern <cmd>: ...".
    if (line.find(" E [") != std::string::npos || line.rfind("tern ", 0) == 0 ||
        line.rfind("tern: ", 0) == 0) {
      return line;
    }
    last = line;
  }
  return last;
}

int Reap(std::vector<ChildProcess*> children, bool quiet) {
  int alive = 0;
  for (ChildProcess* c : children) {
    if (!c->alive) continue;
    int status = 0;
    if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
      c->alive = false;
      const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!quiet && !clean) {
        const std::string why = absl::StrCat(
            c->what, " ", c->id, " exited (", WIFSIGNALED(status) ? "signal " : "status ",
            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
            "): ", FirstErrorLine(c->log));
        std::fprintf(stderr, "\n%s\n  log: %s\n", why.c_str(), c->log.c_str());
        if (!c->killed) c->failure = why;
      }
    } else {
      ++alive;
    }
  }
  return alive;
}

void StopAll(std::vector<ChildProcess*> children) {
  for (ChildProcess* c : children) {
    if (c->alive) kill(c->pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (Reap(children, /*quiet=*/true) > 0 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(50));
  for (ChildProcess* c : children) {
    if (c->alive) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, nullptr, 0);
      c->alive = false;
    }
  }
}

int WaitForPortFile(const std::string& path, ChildProcess& child, double timeout_s,
                    const volatile sig_atomic_t* interrupted) {
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
  while (!*interrupted) {
    std::ifstream f(path);
    int port = 0;
    if (f >> port && port > 0) return port;
    if (Reap({&child}) == 0 || absl::Now() > deadline) return 0;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return 0;
}

namespace {
volatile sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }
}  // namespace

const volatile sig_atomic_t* CatchInterrupts() {
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return &g_interrupted;
}

std::string ProgressBar(double frac, int width) {
  const int full = static_cast<int>(std::clamp(frac, 0.0, 1.0) * width);
  return std::string(full, '#') + std::string(width - full, '-');
}

sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

bool StopSignalPending(const sigset_t& signals) {
  sigset_t pending;
  sigpending(&pending);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) {
    if (sigismember(&signals, sig) && sigismember(&pending, sig)) return true;
  }
  return false;
}

void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace tern
