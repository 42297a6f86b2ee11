// gRPC core's own log lines (stderr, its own format) through spdlog instead, so a daemon's log
// is one stream; a failed TLS handshake, which gRPC reports in OpenSSL's words, is said in
// tern's ("the other side spoke plaintext", "its certificate failed verification").
//
// Thread-safety: RouteGrpcLogs sets process-wide state: call it once from main() before gRPC
// is used. The hook it installs is thread-safe.
#ifndef TERN_CORE_RPC_GRPC_LOG_H_
#define TERN_CORE_RPC_GRPC_LOG_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tern {

void RouteGrpcLogs();

// What a gRPC log line about a failed TLS handshake means, or "" for any other line.
std::string ExplainHandshakeFailure(absl::string_view grpc_message);

}  // namespace tern

#endif  // TERN_CORE_RPC_GRPC_LOG_H_
