#include "core/rpc/grpc_log.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpc/support/log.h"
#include "spdlog/spdlog.h"

namespace tern {

namespace {

void ToSpdlog(gpr_log_func_args* args) {
  const char* message = args->message != nullptr ? args->message : "";
  if (std::string why = ExplainHandshakeFailure(message); !why.empty()) {
    spdlog::warn("{}", why);
    return;
  }
  switch (args->severity) {
    case GPR_LOG_SEVERITY_ERROR:
      spdlog::error("grpc: {}", message);
      break;
    case GPR_LOG_SEVERITY_INFO:
      spdlog::info("grpc: {}", message);
      break;
    default:
      spdlog::debug("grpc: {}", message);
  }
}

}  // namespace

std::string ExplainHandshakeFailure(absl::string_view m) {
  if (!absl::StrContains(m, "andshake failed")) return "";
  std::string what;
  if (absl::StrContains(m, "wrong version number") || absl::StrContains(m, "http request")) {
    what = "the other side spoke plaintext: a client of a TLS daemon needs --tls_ca (and "
           "--tls_cert/--tls_key or --token_file when the daemon asks for them)";
  } else if (absl::StrContains(m, "certificate verify failed")) {
    what = "the other side's certificate failed verification against --tls_ca: another CA, "
           "expired, or not naming the address dialed (tern certs --hosts)";
  } else if (absl::StrContains(m, "alert")) {
    what = "the other side refused this side's TLS: check its --tls_ca against this side's "
           "certificate";
  } else {
    what = "see the reason";
  }
  return absl::StrCat("a TLS handshake failed: ", what, " (", m, ")");
}

void RouteGrpcLogs() { gpr_set_log_function(ToSpdlog); }

}  // namespace tern
