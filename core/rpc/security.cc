#include "core/rpc/security.h"

#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "core/rpc/address.h"
#include "core/rpc/auth.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "spdlog/spdlog.h"

namespace tern {

namespace {

absl::Status Readable(const std::string& path, const char* what) {
  if (access(path.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " ", path));
  }
  return absl::OkStatus();
}

// Cert and key go together; every file named must be readable now (gRPC would otherwise wait
// for it without saying why).
absl::Status CheckFiles(const TlsFiles& tls) {
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both (tern certs makes a development set)");
  }
  if (!tls.cert.empty()) {
    if (absl::Status s = Readable(tls.cert, "certificate (--tls_cert)"); !s.ok()) return s;
    if (absl::Status s = Readable(tls.key, "private key (--tls_key)"); !s.ok()) return s;
  }
  if (!tls.token.empty()) {
    if (absl::Status s = Readable(tls.token, "token file (--token_file)"); !s.ok()) return s;
  }
  if (!tls.tokens.empty()) {
    if (absl::Status s = Readable(tls.tokens, "tokens file (--tokens)"); !s.ok()) return s;
  }
  if (!tls.ca.empty()) return Readable(tls.ca, "CA bundle (--tls_ca)");
  return absl::OkStatus();
}

}  // namespace

bool IsLoopback(const std::string& address) {
  const std::string host = SplitHostPort(address).host;
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& tls, const std::string& listen,
    std::shared_ptr<CallAuthenticator>* authenticator_out) {
  if (authenticator_out != nullptr) authenticator_out->reset();
  if (absl::Status s = CheckFiles(tls); !s.ok()) return s;
  if (tls.cert.empty()) {
    if (!tls.ca.empty() || !tls.tokens.empty()) {
      return absl::InvalidArgumentError(
          "--tls_ca or --tokens on a server needs its --tls_cert and --tls_key");
    }
    if (!IsLoopback(listen)) {
      if (!tls.plaintext) {
        return absl::InvalidArgumentError(
            absl::StrCat("listening on ", listen,
                         " without TLS: give --tls_cert and --tls_key (and --tls_ca "
                         "for mutual TLS; tern certs makes a development set), or --plaintext"));
      }
      spdlog::warn(
          "{}: plaintext (--plaintext): anyone who reaches this port can join, push "
          "or read; use TLS beyond a private network",
          listen);
    }
    return grpc::InsecureServerCredentials();
  }
  // Identity only: the CA is the authenticator's to read (client certificates are verified per
  // call, below), so the provider does not watch it too.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key, tls.cert, tls.refresh_s);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  // A client certificate is asked for but verified by the authenticator, per call, so a
  // certificate from another CA or an expired one is refused with UNAUTHENTICATED and the
  // reason rather than a handshake failure the client sees as "Socket closed". The handshake
  // still proves the client holds the certificate's key.
  options.set_cert_request_type(tls.ca.empty()
                                    ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                    : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY);
  std::shared_ptr<grpc::ServerCredentials> creds =
      grpc::experimental::TlsServerCredentials(options);
  if (!tls.ca.empty() || !tls.tokens.empty()) {
    AuthOptions auth;
    auth.ca = tls.ca;
    auth.tokens = tls.tokens;
    auth.refresh = absl::Seconds(tls.refresh_s);
    TERN_ASSIGN_OR_RETURN(std::shared_ptr<CallAuthenticator> authenticator,
                          CallAuthenticator::Create(auth));
    if (authenticator_out != nullptr) *authenticator_out = authenticator;
    creds->SetAuthMetadataProcessor(std::move(authenticator));
  }
  return creds;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const TlsFiles& tls) {
  if (absl::Status s = CheckFiles(tls); !s.ok()) return s;
  if (tls.ca.empty()) {
    if (!tls.cert.empty()) {
      return absl::InvalidArgumentError(
          "--tls_cert without --tls_ca: a client needs the CA to check the server against");
    }
    if (!tls.token.empty()) {
      return absl::InvalidArgumentError(
          "--token_file without --tls_ca: a token sent in plaintext is anyone's; use TLS");
    }
    return grpc::InsecureChannelCredentials();
  }
  // Read once: gRPC 1.51's file-watching channel credentials left a channel's handshakes timing
  // out for good, now and then, in a process of 25 clients sharing it (tern run --tls).
  grpc::SslCredentialsOptions options;
  TERN_ASSIGN_OR_RETURN(options.pem_root_certs, ReadFile(tls.ca));
  if (!tls.cert.empty()) {
    TERN_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadFile(tls.cert));
    TERN_ASSIGN_OR_RETURN(options.pem_private_key, ReadFile(tls.key));
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(options);
  if (tls.token.empty()) return creds;
  TERN_ASSIGN_OR_RETURN(std::string token, ReadFile(tls.token));
  absl::StripAsciiWhitespace(&token);
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the token file ", tls.token, " is empty"));
  }
  return grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(token));
}

}  // namespace tern
