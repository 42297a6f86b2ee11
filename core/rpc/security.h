// Transport security for every tern server and channel: TLS with certificates read from files
// (a server re-reads them while it runs, so a renewed certificate or CA bundle takes effect
// without a restart: gRPC's FileWatcherCertificateProvider; a client reads them when it makes
// its credentials), mutual TLS when a CA is given to a server (every call must come with a
// certificate that chains to it, or a bearer token from the server's tokens file: checked by
// core/rpc/auth.h), and plaintext only on loopback or when asked for with --plaintext, with a
// warning (docs/deploy.md).
//
// Thread-safety: free functions; the credentials they return are thread-safe.
#ifndef TERN_CORE_RPC_SECURITY_H_
#define TERN_CORE_RPC_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace tern {

struct TlsFiles {
  std::string cert;  // this side's PEM certificate chain
  std::string key;   // its PEM private key
  std::string ca;    // PEM CA bundle the other side's certificate must chain to
  // A client's bearer token file (one line, tern tokens), sent on every call; needs TLS.
  std::string token;
  // A server's tokens file (core/rpc/auth.h): the bearer tokens it takes; needs TLS.
  std::string tokens;
  // Plaintext beyond loopback: allowed only when asked for.
  bool plaintext = false;
  // How often the files are checked for changes.
  unsigned refresh_s = 30;
};

// A server's credentials for `listen` ("HOST:PORT"): TLS with cert and key; with a CA or a
// tokens file, every call must authenticate with a client certificate from that CA or a token
// from that file (core/rpc/auth.h: refusals are UNAUTHENTICATED with the reason); without cert
// and key, plaintext, which a listen address beyond loopback takes only with `plaintext` set
// (and a warning). Missing or unreadable files, or a cert without its key, are errors that name
// the file.
// `authenticator`, when given, receives the one that checks calls (null when none does).
class CallAuthenticator;
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& tls, const std::string& listen,
    std::shared_ptr<CallAuthenticator>* authenticator = nullptr);

// A client's credentials: TLS verifying the server against the CA (and presenting cert and key,
// when given, for mutual TLS, and the bearer token, when given), read from the files now;
// plaintext without a CA. A cert or a token without a CA is an error.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const TlsFiles& tls);

// Whether "HOST:PORT" names this machine only (127.0.0.0/8, ::1, localhost).
bool IsLoopback(const std::string& address);

}  // namespace tern

#endif  // TERN_CORE_RPC_SECURITY_H_
