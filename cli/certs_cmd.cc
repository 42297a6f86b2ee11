// tern certs: a development CA and a certificate per daemon and client, made with openssl, for
// TLS and mutual TLS between tern's daemons (docs/deploy.md). Production sites use their own CA:
// the daemons only need the PEM files. tern tokens: a bearer token per client and the server's
// file of their digests (core/rpc/auth.h).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "clients/flags/flag_types.h"
#include "core/rpc/auth.h"
#include "core/rpc/dev_certs.h"

ABSL_FLAG(std::string, names, "server,client,scheduler,worker-0,worker-1,worker-2,worker-3",
          "certs, tokens: comma-separated holders, one certificate (NAME.crt, NAME.key) or token "
          "(NAME.token) each");
ABSL_FLAG(std::string, hosts, "",
          "certs: comma-separated host names or IP addresses added to every certificate's "
          "subjectAltName (each already names its holder, localhost and 127.0.0.1)");
ABSL_FLAG(tern::Int<tern::In(0, 36500)>, days, 825,
          "certs: days the certificates are valid (0: expired at once, for tests)");
ABSL_DECLARE_FLAG(std::string, out);

namespace tern {

int CertsMain() {
  const std::string dir = absl::GetFlag(FLAGS_out).empty() ? "certs" : absl::GetFlag(FLAGS_out);
  DevCertOptions o;
  o.names = absl::StrSplit(absl::GetFlag(FLAGS_names), ',', absl::SkipEmpty());
  o.hosts = absl::StrSplit(absl::GetFlag(FLAGS_hosts), ',', absl::SkipEmpty());
  o.days = absl::GetFlag(FLAGS_days).value;
  if (o.names.empty()) {
    std::fprintf(stderr, "tern certs: --names is empty\n");
    return 2;
  }
  if (absl::Status s = MakeDevCertificates(dir, o); !s.ok()) {
    std::fprintf(stderr, "tern certs: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s/ca.crt (the CA: give it to every daemon and client as --tls_ca)\n", dir.c_str());
  for (const std::string& n : o.names) {
    std::printf("%s/%s.crt, %s.key (--tls_cert, --tls_key)\n", dir.c_str(), n.c_str(), n.c_str());
  }
  std::printf("valid %d days for %s, localhost, 127.0.0.1%s%s; keep %s/ca.key safe\n", o.days,
              "each holder's name", o.hosts.empty() ? "" : ", ",
              absl::StrJoin(o.hosts, ", ").c_str(), dir.c_str());
  return 0;
}

int TokensMain() {
  const std::string dir = absl::GetFlag(FLAGS_out).empty() ? "certs" : absl::GetFlag(FLAGS_out);
  const std::vector<std::string> names =
      absl::StrSplit(absl::GetFlag(FLAGS_names), ',', absl::SkipEmpty());
  if (names.empty()) {
    std::fprintf(stderr, "tern tokens: --names is empty\n");
    return 2;
  }
  if (absl::Status s = MakeTokens(dir, names); !s.ok()) {
    std::fprintf(stderr, "tern tokens: %s\n", s.ToString().c_str());
    return 1;
  }
  for (const std::string& n : names) {
    std::printf("%s/%s.token (that holder's --token_file; keep it secret)\n", dir.c_str(),
                n.c_str());
  }
  std::printf(
      "%s/tokens (the servers' --tokens: digests only; a holder made again gets a new "
      "token, the old one stops working once servers re-read the file)\n",
      dir.c_str());
  return 0;
}

}  // namespace tern
