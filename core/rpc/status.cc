#include "core/rpc/status.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tern {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  std::string message = s.error_message();
  // What a plaintext client sees of a TLS daemon, and a TLS client of a plaintext one.
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
      (absl::EndsWith(message, "Socket closed") || absl::StrContains(message, "andshake"))) {
    absl::StrAppend(&message,
                    " (the daemon hung up during the connection's setup: when it serves TLS, "
                    "this side needs --tls_ca; when it is plaintext, drop --tls_ca)");
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), message);
}

}  // namespace tern
