#include "core/rpc/dev_certs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tern {

namespace {

// Runs argv[0] (found on PATH) with its output to `log`; an error quotes the log's end.
absl::Status Run(const std::vector<std::string>& argv, const std::string& log) {
  // Everything the child needs is ready before fork: other threads of the caller (gRPC's) may
  // hold the allocator's lock at that moment, so the child only makes system calls.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    umask(077);  // keys readable by their owner only
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  std::string said;
  if (std::FILE* f = std::fopen(log.c_str(), "r")) {
    char buf[512];
    const size_t n = std::fread(buf, 1, sizeof(buf), f);
    said.assign(buf, n);
    std::fclose(f);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run ", argv[0], " (install Debian's openssl package)"));
  }
  return absl::InternalError(absl::StrCat(argv[0], " ", argv[1], " failed: ", said));
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string SubjectAltNames(const std::string& name, const std::vector<std::string>& hosts) {
  std::vector<std::string> sans = {absl::StrCat("DNS:", name), "DNS:localhost", "IP:127.0.0.1"};
  for (const std::string& h : hosts) {
    in6_addr a6;
    in_addr a4;
    const bool ip =
        inet_pton(AF_INET, h.c_str(), &a4) == 1 || inet_pton(AF_INET6, h.c_str(), &a6) == 1;
    sans.push_back(absl::StrCat(ip ? "IP:" : "DNS:", h));
  }
  return absl::StrCat("subjectAltName=", absl::StrJoin(sans, ","));
}

}  // namespace

absl::Status MakeDevCertificates(const std::string& dir, const DevCertOptions& o) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string part = dir.substr(0, slash);  // each parent, then dir itself
    if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::InvalidArgumentError(absl::StrCat("cannot make ", part));
    }
    if (slash == std::string::npos) break;
  }
  const std::string log = dir + "/.openssl.log";
  const std::string ca_crt = dir + "/ca.crt", ca_key = dir + "/ca.key";
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                                       "-nodes"};
  if (!Exists(ca_crt) || !Exists(ca_key)) {
    std::vector<std::string> argv = {o.openssl, "req", "-x509"};
    argv.insert(argv.end(), ec.begin(), ec.end());
    argv.insert(argv.end(),
                {"-keyout", ca_key, "-out", ca_crt, "-days", "3650", "-subj",
                 absl::StrCat("/CN=", o.ca_name), "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign"});
    if (absl::Status s = Run(argv, log); !s.ok()) return s;
  }
  for (const std::string& name : o.names) {
    const std::string base = absl::StrCat(dir, "/", name);
    std::vector<std::string> req = {o.openssl, "req"};
    req.insert(req.end(), ec.begin(), ec.end());
    req.insert(req.end(), {"-keyout", base + ".key", "-out", base + ".csr", "-subj",
                           absl::StrCat("/CN=", name), "-addext", SubjectAltNames(name, o.hosts),
                           "-addext", "extendedKeyUsage=serverAuth,clientAuth"});
    if (absl::Status s = Run(req, log); !s.ok()) return s;
    if (absl::Status s = Run({o.openssl, "x509", "-req", "-in", base + ".csr", "-CA", ca_crt,
                              "-CAkey", ca_key, "-CAcreateserial", "-out", base + ".crt", "-days",
                              absl::StrCat(o.days), "-copy_extensions", "copy"},
                             log);
        !s.ok()) {
      return s;
    }
    unlink((base + ".csr").c_str());
  }
  unlink(log.c_str());
  return absl::OkStatus();
}

}  // namespace tern
