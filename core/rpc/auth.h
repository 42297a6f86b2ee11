// Who is calling: client authentication for every tern server, by a client certificate from the
// run's CA (mutual TLS) or by a per-client bearer token, checked by one gRPC
// AuthMetadataProcessor before any handler runs (so no handler can forget it). A refused call
// ends with UNAUTHENTICATED and a message saying why (no credentials, a certificate from another
// CA, an expired one, an unknown token); a handshake failure could only say "Socket closed". What
// a caller may then do as that name (its client id, its gossip) is checked by the services
// against PrincipalOf.
//
// The name (principal) of a call: the holder of its bearer token when it carries one, else its
// certificate's common name. tern certs names a certificate's holder in its common name;
// tern tokens makes the tokens file:
//
//   # NAME sha256:HEX, one a line; the server keeps digests only
//   client-0 sha256:5f1c…
//
// Both files (CA bundle, tokens) are re-read when they change, so a CA is rotated or a token
// revoked without a restart. docs/deploy.md says how to use them.
//
// Thread-safety: CallAuthenticator is thread-safe (gRPC calls Process from many threads); the
// free functions are pure or read files.
#ifndef TERN_CORE_RPC_AUTH_H_
#define TERN_CORE_RPC_AUTH_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace tern {

// The auth-context property the principal is stored under.
inline constexpr char kPrincipalProperty[] = "tern_principal";

// The principal a call was authenticated as; empty for a call no credentials were asked of (a
// server with neither a CA nor tokens).
std::string PrincipalOf(const grpc::ServerContextBase& context);

// Whether `principal` matches one of `patterns`: a name, or a prefix ending in '*' ("worker-*").
// No patterns: anyone.
bool PrincipalAllowed(const std::vector<std::string>& patterns, const std::string& principal);

// The worker id a caller's name binds it to under --peer_names / --member_names: the number the
// name ends in ("worker-3": 3); nullopt when it ends in none (or one past 2^31).
std::optional<int> WorkerIdOf(const std::string& principal);

// Whether a call's peer (grpc's "ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "unix:...") is on this
// host: its loopback, a Unix socket, this process (gRPC's in-process transport), or one of the
// host's own interface addresses (a caller of a daemon that listens on the host's address).
bool IsLocalPeer(const std::string& peer);

struct AuthOptions {
  std::string ca;      // PEM CA bundle client certificates must chain to; "" takes none
  std::string tokens;  // tokens file; "" takes no tokens
  // Whether a call with neither credential is refused (set when ca or tokens is).
  bool required = false;
  absl::Duration refresh = absl::Seconds(30);  // how often the files are checked for changes
};

// The help text of each daemon's tern_*_calls_unauthenticated_total (RefusalsByReason).
inline constexpr char kUnauthenticatedCallsHelp[] =
    "Calls refused before any handler for their credentials, by reason (core/rpc/auth.h).";

class CallAuthenticator : public grpc::AuthMetadataProcessor {
 public:
  // Reads the files now: a missing or malformed one is an error that names it.
  // `clock` (null: the real one) must outlive the authenticator.
  static absl::StatusOr<std::shared_ptr<CallAuthenticator>> Create(AuthOptions options,
                                                                   Clock* clock = nullptr);

  // Verification is in memory (a certificate's result is cached): no need for gRPC's thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

  // The principal for a call with this metadata and peer certificate (PEM leaf, "" for none;
  // `chain`: the PEM chain it came with), or UNAUTHENTICATED saying why: Process without gRPC.
  absl::StatusOr<std::string> Authenticate(const std::string& authorization,
                                           const std::string& pem_cert, const std::string& chain)
      ABSL_LOCKS_EXCLUDED(mu_, counts_mu_);

  // Calls refused so far, by reason: no_credentials, another_ca, expired, not_yet_valid,
  // bad_certificate, unknown_token, bad_header, tokens_not_taken (the daemons' metrics).
  std::map<std::string, uint64_t> RefusalsByReason() const ABSL_LOCKS_EXCLUDED(counts_mu_);

 private:
  struct Files;  // what the files hold, swapped whole when they change
  CallAuthenticator(AuthOptions options, Clock* clock);
  // Authenticate's answer; `reason` names a refusal.
  absl::StatusOr<std::string> Check(const std::string& authorization, const std::string& pem_cert,
                                    const std::string& chain, const char** reason)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Reload(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<const Files> Current() ABSL_LOCKS_EXCLUDED(mu_);

  const AuthOptions options_;
  Clock* const clock_;
  absl::Mutex mu_;
  std::shared_ptr<const Files> files_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  mutable absl::Mutex counts_mu_;
  std::map<std::string, uint64_t> refusals_ ABSL_GUARDED_BY(counts_mu_);
};

// A token file's line for `name` holding `token`, and a fresh random token.
std::string TokenLine(const std::string& name, const std::string& token);
absl::StatusOr<std::string> NewToken();

// Writes DIR/NAME.token (mode 0600) for each name and adds their lines to DIR/tokens (a name
// already there gets a new token: the old one stops working once the server re-reads the file).
absl::Status MakeTokens(const std::string& dir, const std::vector<std::string>& names);

}  // namespace tern

#endif  // TERN_CORE_RPC_AUTH_H_
