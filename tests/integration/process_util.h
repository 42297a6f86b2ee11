// Helpers of the integration tests: temporary folders, the `tern` binary as a child process,
// and the run folders' files.
#ifndef TERN_TESTS_INTEGRATION_PROCESS_UTIL_H_
#define TERN_TESTS_INTEGRATION_PROCESS_UTIL_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tern {

inline std::string MakeTempDir() {
  std::string t = absl::StrCat(::testing::TempDir(), "/tern-it-XXXXXX");
  char* d = mkdtemp(t.data());
  EXPECT_NE(d, nullptr);
  return t;
}

// Runs `program` with `args`, its output to `log`. With `own_group`, the child leads a new
// process group, as a shell job does (so a test can send the group SIGINT the way a terminal's
// Ctrl-C does).
inline pid_t SpawnProgram(const std::string& program, const std::vector<std::string>& args,
                          const std::string& log, bool own_group = false) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (own_group) setpgid(0, 0);
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 1);
  dup2(fd, 2);
  std::vector<char*> argv{const_cast<char*>(program.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(program.c_str(), argv.data());
  _exit(127);
}

// Runs the `tern` binary under test.
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& log,
                   bool own_group = false) {
  return SpawnProgram(TERN_BINARY, args, log, own_group);
}

inline int Wait(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A file's text, or "" (named apart from common/file_util.h's ReadFile: an inline function of the
// same name and parameters would be one symbol with it, whatever the return type).
inline std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Writes `text` to `path` (a test's own file; a failure shows as the file missing).
inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Whether the daemons under test run with AddressSanitizer, whose quarantine and redzones make
// resident memory meaningless as a bound.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// Resident memory of process `pid` in MiB (VmRSS), or -1.
inline double RssMb(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      double kb = 0;
      f >> kb;
      return kb / 1024;
    }
  }
  return -1;
}

// Waits for a daemon's port file; 0 if it never came.
// A port free on 127.0.0.1 now, for a daemon whose port must be known before it listens (a
// standby's; Prometheus's, which cannot say which port 0 became).
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

inline int WaitForPort(const std::string& path) {
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {
    std::ifstream(path) >> port;
    if (port == 0) usleep(50 * 1000);
  }
  return port;
}

// Counts of each status code over `statuses`.
inline std::map<int, int> CountCodes(const std::vector<grpc::Status>& statuses) {
  std::map<int, int> n;
  for (const auto& s : statuses) ++n[static_cast<int>(s.error_code())];
  return n;
}

// A number from the last metrics line, e.g. Last(dir, "test_acc").
inline double Last(const std::string& dir, const std::string& key) {
  std::ifstream f(dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(f, line)) {
    if (!line.empty()) last = line;
  }
  // std::regex trips GCC 12's -Wmaybe-uninitialized under ASan; the lines are ours and flat.
  const std::string tag = "\"" + key + "\":";
  const size_t at = last.find(tag);
  if (at == std::string::npos) return -1;
  return std::strtod(last.c_str() + at + tag.size(), nullptr);
}

inline bool Synthetic(const std::string& dir) {
  return ReadText(dir + "/run.json").find("\"synthetic\":true") != std::string::npos;
}

// A number from a flat JSON line, or -1.
inline double Field(const std::string& line, const std::string& key) {
  const std::string tag = "\"" + key + "\":";
  const size_t at = line.find(tag);
  if (at == std::string::npos) return -1;
  return std::strtod(line.c_str() + at + tag.size(), nullptr);
}

// The non-empty lines of a file.
inline std::vector<std::string> Lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

// The training flags of the integration tests' diloco workers (fp4, H = 20, 5 s rounds, batch 64)
// for `steps` steps, writing their round log and final model to the paths given.
inline std::vector<std::string> DilocoTrainingArgs(int steps, const std::string& round_log,
                                                   const std::string& final_model) {
  return {"--algorithm=diloco",
          "--local_steps=20",
          "--codec=fp4",
          "--round_timeout=5",
          "--epochs=40",
          "--batch=64",
          absl::StrCat("--max_steps=", steps),
          absl::StrCat("--total_steps=", steps),
          "--round_log=" + round_log,
          "--final_model=" + final_model,
          "--exit_after_training",
          "--log_level=info"};
}

}  // namespace tern

#endif  // TERN_TESTS_INTEGRATION_PROCESS_UTIL_H_
