// What a daemon serves with: `tern worker`, `tern server`, `tern scheduler` (command_table.cc:
// this file is their group).
#include "clients/flags/service_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "daemons: address to serve on (port 0: any)");
ABSL_FLAG(std::string, port_file, "", "daemons: write the bound port here once listening");
ABSL_FLAG(std::string, metrics_listen, "",
          "daemons: serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 0.0.0.0:9464; "
          "port 0 picks one; empty: no endpoint)");

ABSL_FLAG(std::string, tokens, "",
          "daemons: the bearer tokens this server takes, 'NAME sha256:HEX' a line (tern tokens "
          "writes it); needs --tls_cert; re-read when the file changes");
ABSL_FLAG(bool, plaintext, false,
          "daemons: serve without TLS on an address beyond loopback (logged as a warning)");

namespace tern {

std::string MetricsListenFromFlags() { return absl::GetFlag(FLAGS_metrics_listen); }

absl::Status CheckHostPort(absl::string_view flag, absl::string_view value) {
  const size_t colon = value.rfind(':');
  int port = -1;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, "=", value, ": want HOST:PORT with a port in [0, 65535] (0: any)"));
  }
  return absl::OkStatus();
}

absl::Status CheckServingFlags() {
  TERN_RETURN_IF_ERROR(CheckHostPort("listen", absl::GetFlag(FLAGS_listen)));
  const std::string metrics = absl::GetFlag(FLAGS_metrics_listen);
  if (!metrics.empty()) TERN_RETURN_IF_ERROR(CheckHostPort("metrics_listen", metrics));
  return absl::OkStatus();
}

std::string ListenWithPort(const std::string& listen, int port) {
  return absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
}

void LogMetricsAddress(const std::string& who, const std::string& listen, int port) {
  if (port > 0) spdlog::info("{}: metrics at http://{}/metrics", who, ListenWithPort(listen, port));
}

}  // namespace tern
