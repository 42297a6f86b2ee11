// A development certificate authority and certificates signed by it, made with Debian's
// `openssl` command: what `tern certs` writes, and what the TLS tests use. Each certificate is
// good for both ends of a connection (serverAuth and clientAuth: a daemon serves and calls), and
// names its holder in the common name and in subjectAltName, with localhost and 127.0.0.1.
//
//   DIR/ca.crt, DIR/ca.key        the CA (made once; reused while both files exist)
//   DIR/NAME.crt, DIR/NAME.key    one pair per name (keys mode 0600)
//
// Thread-safety: a free function (it runs child processes).
#ifndef TERN_CORE_RPC_DEV_CERTS_H_
#define TERN_CORE_RPC_DEV_CERTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tern {

struct DevCertOptions {
  std::vector<std::string> names;  // e.g. server, client-0, worker-0
  // More subjectAltNames for every certificate: DNS names or IP addresses.
  std::vector<std::string> hosts;
  int days = 825;  // validity; 0 expires at once (tests)
  std::string ca_name = "tern development CA";
  std::string openssl = "openssl";
};

absl::Status MakeDevCertificates(const std::string& dir, const DevCertOptions& options);

}  // namespace tern

#endif  // TERN_CORE_RPC_DEV_CERTS_H_
