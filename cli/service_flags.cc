#include "cli/service_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "daemons: serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 0.0.0.0:9464; "
          "port 0 picks one; empty: no endpoint)");

namespace tern {

std::string MetricsListenFromFlags() { return absl::GetFlag(FLAGS_metrics_listen); }

std::string ListenWithPort(const std::string& listen, int port) {
  return absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
}

}  // namespace tern
