#include "cli/service_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "daemons: serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 0.0.0.0:9464; "
          "port 0 picks one; empty: no endpoint)");

ABSL_FLAG(std::string, tls_cert, "",
          "daemons and clients: this side's PEM certificate (tern certs makes a development set); "
          "re-read when the file changes");
ABSL_FLAG(std::string, tls_key, "", "daemons and clients: the certificate's PEM private key");
ABSL_FLAG(std::string, tls_ca, "",
          "daemons and clients: PEM CA bundle the other side must chain to; on a server it turns "
          "on mutual TLS (clients must present a certificate it signed)");
ABSL_FLAG(std::string, token_file, "",
          "daemons and clients: a file holding this side's bearer token (tern tokens), sent on "
          "every call; needs --tls_ca");
ABSL_FLAG(std::string, tokens, "",
          "daemons: the bearer tokens this server takes, 'NAME sha256:HEX' a line (tern tokens "
          "writes it); needs --tls_cert; re-read when the file changes");
ABSL_FLAG(bool, plaintext, false,
          "daemons: serve without TLS on an address beyond loopback (logged as a warning)");

namespace tern {

std::string MetricsListenFromFlags() { return absl::GetFlag(FLAGS_metrics_listen); }

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

std::string ListenWithPort(const std::string& listen, int port) {
  return absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
}

void LogMetricsAddress(const std::string& who, const std::string& listen, int port) {
  if (port > 0) spdlog::info("{}: metrics at http://{}/metrics", who, ListenWithPort(listen, port));
}

}  // namespace tern
