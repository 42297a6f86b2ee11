#include "cli/local_cluster.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/report.h"
#include "common/json_lines.h"
#include "common/status_macros.h"
#include "core/rpc/dev_certs.h"
#include "core/rpc/security.h"

namespace tern {
namespace {

constexpr char kIpCommand[] = "/usr/sbin/ip";  // iproute2

}  // namespace

LocalCluster::LocalCluster(std::string self_exe, std::string dir)
    : self_exe_(std::move(self_exe)),
      dir_(std::move(dir)),
      interrupted_(CatchInterrupts()),
      metrics_(dir_ + "/metrics.jsonl") {}

LocalCluster::~LocalCluster() {
  if (!finished_) StopAll(All());
}

std::vector<ChildProcess*> LocalCluster::All() {
  std::vector<ChildProcess*> out;
  for (ChildProcess& c : children_) out.push_back(&c);
  return out;
}

ChildProcess* LocalCluster::Start(std::string what, int id, const std::vector<std::string>& args,
                                  const std::string& log_name, const std::string& netns) {
  ChildProcess& c = children_.emplace_back();
  c.what = std::move(what);
  c.id = id;
  c.log = absl::StrCat(dir_, "/", log_name);
  c.netns = netns;
  c.pid = SpawnIn(c.netns, args, c.log);
  c.alive = c.pid > 0;
  return &c;
}

pid_t LocalCluster::SpawnIn(const std::string& netns, const std::vector<std::string>& args,
                            const std::string& log) {
  if (netns.empty()) return Spawn(self_exe_, args, log);
  // `ip netns exec` execs the command in place: the pid is the child's own (Kill works).
  std::vector<std::string> wrapped = {"netns", "exec", netns, self_exe_};
  wrapped.insert(wrapped.end(), args.begin(), args.end());
  return Spawn(kIpCommand, wrapped, log);
}

void LocalCluster::Restart(ChildProcess* child, const std::vector<std::string>& args) {
  child->log += ".restarted";
  child->pid = SpawnIn(child->netns, args, child->log);
  child->alive = child->pid > 0;
  child->killed = false;
  child->failure.clear();
}

void LocalCluster::Kill(ChildProcess* child) {
  child->killed = true;
  if (child->alive) kill(child->pid, SIGKILL);
}

void LocalCluster::Stop(ChildProcess* child) {
  child->killed = true;
  if (child->alive) kill(child->pid, SIGTERM);
}

std::vector<std::string> LocalCluster::Failures() {
  Reap();  // a child that ended since the last look counts too
  std::vector<std::string> out;
  for (ChildProcess* c : All()) {
    if (!c->failure.empty()) out.push_back(c->failure);
  }
  return out;
}

absl::StatusOr<std::string> LocalCluster::WaitForAddress(ChildProcess* child,
                                                         const std::string& port_name,
                                                         absl::Duration timeout,
                                                         const std::string& host) {
  const int port = WaitForPortFile(absl::StrCat(dir_, "/", port_name), *child,
                                   absl::ToDoubleSeconds(timeout), interrupted_);
  if (interrupted()) return absl::CancelledError("interrupted");
  if (port == 0) {
    return absl::UnavailableError(
        absl::StrCat(child->what, " ", child->id, " did not start; its log:\n", Tail(child->log)));
  }
  return absl::StrCat(host, ":", port);
}

int LocalCluster::Reap() { return tern::Reap(All()); }

void LocalCluster::WriteConfig(const v1::RunConfig& config) {
  std::ofstream(dir_ + "/run.json") << ToJsonLine(config);
}

void LocalCluster::AppendMetrics(const v1::MetricsRow& row) {
  metrics_ << ToJsonLine(row);
  metrics_.flush();
}

void LocalCluster::Finish() {
  StopAll(All());
  finished_ = true;
  metrics_.close();
  if (absl::StatusOr<RunSeries> run = LoadRun(dir_); run.ok()) {
    std::ofstream(dir_ + "/report.html") << RenderReport({*run});
  }
}

absl::StatusOr<std::vector<std::pair<int, int64_t>>> ParseKillList(const std::string& value,
                                                                   const std::string& flag, int ids,
                                                                   int64_t min_at) {
  std::vector<std::pair<int, int64_t>> kills;
  std::vector<bool> seen(static_cast<size_t>(std::max(ids, 0)));
  for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
    std::vector<std::string> p = absl::StrSplit(item, '@');
    int id = -1;
    int64_t at = 0;
    if (p.size() != 2 || !absl::SimpleAtoi(p[0], &id) || !absl::SimpleAtoi(p[1], &at) || id < 0 ||
        id >= ids || at < min_at || seen[static_cast<size_t>(id)]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " wants ID@N[,ID@N...], each ID < ", ids, " and once, each N >= ", min_at));
    }
    seen[static_cast<size_t>(id)] = true;
    kills.emplace_back(id, at);
  }
  return kills;
}

absl::Status LocalCluster::UseTls(const std::vector<std::string>& holders) {
  DevCertOptions o;
  o.names = holders;
  o.names.push_back("launcher");
  TERN_RETURN_IF_ERROR(MakeDevCertificates(dir_ + "/certs", o));
  tls_ = true;
  TlsFiles launcher;
  launcher.cert = dir_ + "/certs/launcher.crt";
  launcher.key = dir_ + "/certs/launcher.key";
  launcher.ca = dir_ + "/certs/ca.crt";
  TERN_ASSIGN_OR_RETURN(credentials_, ChannelCredentialsFor(launcher));
  return absl::OkStatus();
}

std::vector<std::string> LocalCluster::TlsArgs(const std::string& holder) const {
  if (!tls_) return {};
  const std::string base = absl::StrCat(dir_, "/certs/", holder);
  return {absl::StrCat("--tls_cert=", base, ".crt"), absl::StrCat("--tls_key=", base, ".key"),
          absl::StrCat("--tls_ca=", dir_, "/certs/ca.crt")};
}

}  // namespace tern
