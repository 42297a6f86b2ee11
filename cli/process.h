// Child processes of `tern run`: spawn with output to a log file, reap, stop all.
//
// Thread-safety: call from one thread (the launcher's).
#ifndef TERN_CLI_PROCESS_H_
#define TERN_CLI_PROCESS_H_

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace tern {

struct ChildProcess {
  int id = 0;
  std::string what = "worker";  // for messages: "worker 3", "server", "client group 2"
  pid_t pid = -1;
  bool alive = false;
  std::string log;
  std::string netns;    // the network namespace it runs in ("": the launcher's)
  bool killed = false;  // SIGKILLed on purpose (fault injection): its end is no failure
  std::string failure;  // why it ended, when it ended unbidden and not cleanly
};

// fork + execv(exe, args) with stdout and stderr to `log`; -1 on failure.
pid_t Spawn(const std::string& exe, const std::vector<std::string>& args, const std::string& log);
// The last `bytes` of a file.
std::string Tail(const std::string& path, size_t bytes = 2000);
// The line of a child's log that says why it failed: its first error (an error-level log line or
// a "tern ...:" message), else its last line.
std::string FirstErrorLine(const std::string& path);
// Marks children that exited (printing why and noting it in `failure`, unless quiet or killed on
// purpose); returns how many are alive.
int Reap(std::vector<ChildProcess*> children, bool quiet = false);
// SIGTERM, up to 15 s to exit, then SIGKILL.
void StopAll(std::vector<ChildProcess*> children);
// Waits for `path` to hold a positive port number; 0 when `child` died or `timeout` passed.
int WaitForPortFile(const std::string& path, ChildProcess& child, double timeout_s,
                    const volatile sig_atomic_t* interrupted);

// Makes SIGINT and SIGTERM set the returned flag instead of ending the process, so a launcher
// can stop its children and still write what it measured.
const volatile sig_atomic_t* CatchInterrupts();

// A text progress bar of `width` characters for a fraction in [0, 1].
std::string ProgressBar(double frac, int width = 24);
// Blocks SIGINT, SIGTERM and SIGUSR1 in this thread (and every thread started later), for a
// daemon's main thread to sigwait() on; returns the set.
sigset_t BlockStopSignals();
// Whether one of `signals` (BlockStopSignals) arrived and waits for sigwait: a loop that waits
// for something else before the process reaches its sigwait checks it, so a stop is not
// ignored meanwhile.
bool StopSignalPending(const sigset_t& signals);
// Writes `port` to `path` (write, then rename, so a reader never sees a partial file); no-op
// for an empty path.
void WritePortFile(const std::string& path, int port);

}  // namespace tern

#endif  // TERN_CLI_PROCESS_H_
