// What the daemons (`tern worker`, `tern server`, `tern scheduler`) and the callers of a daemon
// share: where a daemon serves (service_flags.cc), the certificates it serves and calls with
// (tls_flags.cc), a caller's token (caller_flags.cc), and the systemd watchdog's liveness rule.
#ifndef TERN_CLIENTS_FLAGS_SERVICE_FLAGS_H_
#define TERN_CLIENTS_FLAGS_SERVICE_FLAGS_H_

#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/rpc/security.h"
#include "grpcpp/grpcpp.h"

// Declared once here; each file defining them includes this one.
ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, tokens);
ABSL_DECLARE_FLAG(bool, plaintext);

namespace tern {

// --metrics_listen: "HOST:PORT" of the daemon's Prometheus /metrics endpoint ("" = none).
std::string MetricsListenFromFlags();

// --tls_cert, --tls_key, --tls_ca, --token_file, --tokens, --plaintext (core/rpc/security.h).
TlsFiles TlsFromFlags();
// Channel credentials from those flags, or the error that ends the command.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFromFlags();

// --listen (HOST:PORT) and --metrics_listen (empty or HOST:PORT): a host and a port in
// [0, 65535], checked before anything binds.
absl::Status CheckServingFlags();
// `value` of --`flag` as HOST:PORT ([IPv6]:PORT too).
absl::Status CheckHostPort(absl::string_view flag, absl::string_view value);

// `listen` ("HOST:PORT") with the port actually bound (port 0 asked for any).
std::string ListenWithPort(const std::string& listen, int port);
// Logs "WHO: metrics at http://HOST:PORT/metrics" when the daemon serves metrics (port > 0).
void LogMetricsAddress(const std::string& who, const std::string& listen, int port);

// A daemon whose periodic work (a ticker, a round loop) last ran at `last` is alive while this
// is recent; systemd's watchdog goes unfed after that.
inline bool RanRecently(absl::Time last, absl::Duration within) {
  return absl::Now() - last < within;
}

}  // namespace tern

#endif  // TERN_CLIENTS_FLAGS_SERVICE_FLAGS_H_
