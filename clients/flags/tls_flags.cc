// The certificates a daemon serves with and a caller calls with: every command that serves or
// calls (`tern worker`, `tern server`, `tern client`, `tern scheduler`, `tern health`;
// command_table.cc: this file is their group).
#include "absl/flags/flag.h"
#include "clients/flags/service_flags.h"

ABSL_FLAG(std::string, tls_cert, "",
          "daemons and clients: this side's PEM certificate (tern certs makes a development set); "
          "re-read when the file changes");
ABSL_FLAG(std::string, tls_key, "", "daemons and clients: the certificate's PEM private key");
ABSL_FLAG(std::string, tls_ca, "",
          "daemons and clients: PEM CA bundle the other side must chain to; on a server it turns "
          "on mutual TLS (clients must present a certificate it signed)");

namespace tern {

TlsFiles TlsFromFlags() {
  TlsFiles t;
  t.cert = absl::GetFlag(FLAGS_tls_cert);
  t.key = absl::GetFlag(FLAGS_tls_key);
  t.ca = absl::GetFlag(FLAGS_tls_ca);
  t.token = absl::GetFlag(FLAGS_token_file);
  t.tokens = absl::GetFlag(FLAGS_tokens);
  t.plaintext = absl::GetFlag(FLAGS_plaintext);
  return t;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFromFlags() {
  return ChannelCredentialsFor(TlsFromFlags());
}

}  // namespace tern
