// What the daemons (`tern worker`, `tern server`, `tern scheduler`) share for running as a
// service: the metrics endpoint's flag and the systemd watchdog's liveness rule.
#ifndef TERN_CLI_SERVICE_FLAGS_H_
#define TERN_CLI_SERVICE_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/rpc/security.h"
#include "grpcpp/grpcpp.h"

namespace tern {

// --metrics_listen: "HOST:PORT" of the daemon's Prometheus /metrics endpoint ("" = none).
std::string MetricsListenFromFlags();

// --tls_cert, --tls_key, --tls_ca, --token_file, --tokens, --plaintext (core/rpc/security.h).
TlsFiles TlsFromFlags();
// Channel credentials from those flags, or the error that ends the command.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFromFlags();

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

#endif  // TERN_CLI_SERVICE_FLAGS_H_
