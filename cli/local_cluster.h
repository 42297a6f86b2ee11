// The processes of one `tern run` on this machine, in its run folder. It spawns the children
// (each logging to a file in the folder), waits for the ports they bind, notices one that dies
// (saying why, from its log), kills one for fault injection and starts it again, appends the
// run's metrics rows as they come, and at the end stops everyone and writes report.html. Both
// `tern run` modes stand on it: gossip workers, and a server with client groups.
//
// Thread-safety: call from one thread (the launcher's). Ctrl-C (SIGINT, SIGTERM) is caught from
// construction on and only sets interrupted().
#ifndef TERN_CLI_LOCAL_CLUSTER_H_
#define TERN_CLI_LOCAL_CLUSTER_H_

#include <signal.h>

#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/process.h"
#include "grpcpp/grpcpp.h"
#include "tern/v1/records.pb.h"

namespace tern {

class LocalCluster {
 public:
  // `dir` is the run folder (it exists); children run `self_exe`.
  LocalCluster(std::string self_exe, std::string dir);
  ~LocalCluster();  // stops every child still running

  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  const std::string& dir() const { return dir_; }
  bool interrupted() const { return *interrupted_ != 0; }

  // Starts `tern <args>` as `what` `id`, its output in dir/<log_name>. The child lives as long
  // as the cluster; check its `alive`.
  // With `netns`, the child runs in that network namespace (`ip netns exec`; root only).
  ChildProcess* Start(std::string what, int id, const std::vector<std::string>& args,
                      const std::string& log_name, const std::string& netns = "");
  // Starts `child` again with `args`, in its namespace (its output now in <log>.restarted).
  void Restart(ChildProcess* child, const std::vector<std::string>& args);
  // SIGKILLs `child` (fault injection).
  void Kill(ChildProcess* child);
  // SIGTERMs `child` (a graceful leave): its end is no failure either.
  void Stop(ChildProcess* child);
  // "HOST:PORT" once `child` wrote dir/<port_name> (its --port_file); an error with the tail
  // of its log when it died or `timeout` passed, Cancelled on Ctrl-C.
  absl::StatusOr<std::string> WaitForAddress(ChildProcess* child, const std::string& port_name,
                                             absl::Duration timeout,
                                             const std::string& host = "127.0.0.1");
  // Marks children that exited, saying why; returns how many are alive.
  int Reap();
  // Why each child that ended unbidden failed (not the ones Kill ended), for the run's verdict;
  // reaps first.
  std::vector<std::string> Failures();

  void WriteConfig(const v1::RunConfig& config);
  // One row of metrics.jsonl, flushed at once (a reader, or a crash, sees every row).
  void AppendMetrics(const v1::MetricsRow& row);
  // Stops every child, closes metrics.jsonl and writes report.html from the folder.
  void Finish();

  // Mutual TLS for the run (`tern run --tls`): a development CA and a certificate for each of
  // `holders` and for the launcher itself, in dir/certs. Afterwards TlsArgs(holder) are the flags
  // a child needs, and credentials() secure the launcher's own channels (null before: plaintext).
  absl::Status UseTls(const std::vector<std::string>& holders);
  std::vector<std::string> TlsArgs(const std::string& holder) const;
  std::shared_ptr<grpc::ChannelCredentials> credentials() const { return credentials_; }

 private:
  std::vector<ChildProcess*> All();
  // `tern <args>` in `netns` ("": here), its output to `log`.
  pid_t SpawnIn(const std::string& netns, const std::vector<std::string>& args,
                const std::string& log);

  const std::string self_exe_;
  const std::string dir_;
  const volatile sig_atomic_t* const interrupted_;
  std::deque<ChildProcess> children_;  // a deque: pointers to its elements stay valid
  std::ofstream metrics_;
  bool finished_ = false;
  bool tls_ = false;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
};

// `args` followed by `more` (a child's flags and its TlsArgs).
inline std::vector<std::string> Concat(std::vector<std::string> args,
                                       const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// A fault-injection list "ID@AT[,ID@AT...]" (--kill_worker, --kill_client_at_round): each ID in
// [0, ids) at most once, each AT >= min_at; InvalidArgument naming `flag` and the form otherwise.
absl::StatusOr<std::vector<std::pair<int, int64_t>>> ParseKillList(const std::string& value,
                                                                   const std::string& flag, int ids,
                                                                   int64_t min_at);

}  // namespace tern

#endif  // TERN_CLI_LOCAL_CLUSTER_H_
