#include "core/rpc/auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace tern {

namespace auth_internal {

// Outside the anonymous namespace: CallAuthenticator::Files, which has external linkage, holds one.
struct StoreDeleter {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
using StorePtr = std::unique_ptr<X509_STORE, StoreDeleter>;

}  // namespace auth_internal

namespace {

constexpr char kDigestPrefix[] = "sha256:";
constexpr size_t kMaxCachedCertificates = 4096;

struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct StoreCtxDeleter {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};
struct StackDeleter {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using StackPtr = std::unique_ptr<STACK_OF(X509), StackDeleter>;

std::string Sha256Hex(absl::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), static_cast<size_t>(size)));
}

// Every certificate in a PEM text (a bundle or a chain), in order.
std::vector<X509Ptr> ParsePem(absl::string_view pem) {
  std::vector<X509Ptr> certs;
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return certs;
  while (X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) certs.emplace_back(x);
  BIO_free(bio);
  return certs;
}

std::string CommonName(X509* cert) {
  char buf[256] = {};
  const int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf,
                                          static_cast<int>(sizeof(buf)));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

absl::Time NotAfter(X509* cert) {
  struct tm t = {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &t) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&t));
}

absl::StatusOr<absl::flat_hash_map<std::string, std::string>> ParseTokens(const std::string& path,
                                                                          absl::string_view text) {
  absl::flat_hash_map<std::string, std::string> names;  // digest -> holder
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    absl::string_view digest = f.size() == 2 ? f[1] : absl::string_view();
    if (f.size() != 2 || !absl::ConsumePrefix(&digest, kDigestPrefix) || digest.size() != 64 ||
        !std::all_of(digest.begin(), digest.end(), absl::ascii_isxdigit)) {
      return absl::InvalidArgumentError(absl::StrCat("tokens file ", path, " line ", line_no,
                                                     ": want 'NAME sha256:HEX' (tern tokens)"));
    }
    names[absl::AsciiStrToLower(digest)] = std::string(f[0]);
  }
  return names;
}

// Writes a file only its owner reads, from its creation on.
absl::Status WriteSecret(const std::string& path, const std::string& text) {
  unlink(path.c_str());
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path));
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path));
}

}  // namespace

using auth_internal::StorePtr;

struct CallAuthenticator::Files {
  std::string ca_text;
  std::string tokens_text;
  StorePtr store;  // null without a CA
  absl::flat_hash_map<std::string, std::string> tokens;
  // Certificates verified since these files were read: PEM digest -> (holder, not after).
  mutable absl::Mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::pair<std::string, absl::Time>> verified
      ABSL_GUARDED_BY(cache_mu);
};

std::string PrincipalOf(const grpc::ServerContextBase& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return "";
  const std::vector<grpc::string_ref> v = auth->FindPropertyValues(kPrincipalProperty);
  return v.empty() ? std::string() : std::string(v.front().data(), v.front().size());
}

std::optional<int> WorkerIdOf(const std::string& principal) {
  const size_t digits = principal.find_last_not_of("0123456789") + 1;
  int id = -1;
  if (digits == principal.size() || !absl::SimpleAtoi(principal.substr(digits), &id)) {
    return std::nullopt;
  }
  return id;
}

namespace {

// The IP address of a gRPC peer ("ipv4:10.0.0.1:5000", "ipv6:[fe80::1]:5000", the brackets
// possibly %-escaped), without its port; "" for any other kind.
std::string PeerIp(absl::string_view peer) {
  if (absl::ConsumePrefix(&peer, "ipv4:")) {
    const size_t colon = peer.rfind(':');
    return std::string(colon == absl::string_view::npos ? peer : peer.substr(0, colon));
  }
  if (!absl::ConsumePrefix(&peer, "ipv6:")) return "";
  std::string p = absl::StrReplaceAll(peer, {{"%5B", "["}, {"%5D", "]"}});
  const size_t close = p.find(']');
  if (p.empty() || p[0] != '[' || close == std::string::npos) return "";
  std::string ip = p.substr(1, close - 1);
  if (const size_t zone = ip.find('%'); zone != std::string::npos) ip.resize(zone);
  return ip;
}

// Whether `ip` is one of this host's interface addresses: a TCP peer there is on this host (its
// handshake's replies go to this host, so no other can complete one from it).
bool IsThisHostsAddress(const std::string& ip) {
  in6_addr want6{};
  in_addr want4{};
  const bool v4 = inet_pton(AF_INET, ip.c_str(), &want4) == 1;
  if (!v4 && inet_pton(AF_INET6, ip.c_str(), &want6) != 1) return false;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return false;
  bool found = false;
  for (ifaddrs* a = all; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    if (v4 && a->ifa_addr->sa_family == AF_INET) {
      found = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == want4.s_addr;
    } else if (!v4 && a->ifa_addr->sa_family == AF_INET6) {
      found = std::memcmp(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, &want6,
                          sizeof(want6)) == 0;
    }
  }
  freeifaddrs(all);
  return found;
}

}  // namespace

bool IsLocalPeer(const std::string& peer) {
  // gRPC's in-process transport (a server's InProcessChannel) names no peer: "unknown".
  if (peer == "unknown" || absl::StartsWith(peer, "inproc") || absl::StartsWith(peer, "unix:") ||
      absl::StartsWith(peer, "ipv4:127.") || absl::StartsWith(peer, "ipv6:[::1]") ||
      absl::StartsWith(peer, "ipv6:[::ffff:127.") || absl::StartsWith(peer, "ipv6:%5B::1%5D") ||
      absl::StartsWith(peer, "ipv6:%5B::ffff:127.")) {
    return true;
  }
  // A caller that reached a daemon listening on the host's own address (`tern launch` starts a
  // worker on the address its peers reach, and the script beside it calls that).
  std::string ip = PeerIp(peer);
  if (absl::StartsWith(ip, "::ffff:") && ip.find('.') != std::string::npos) ip = ip.substr(7);
  return !ip.empty() && IsThisHostsAddress(ip);
}

bool PrincipalAllowed(const std::vector<std::string>& patterns, const std::string& principal) {
  if (patterns.empty()) return true;
  for (const std::string& p : patterns) {
    if (p == principal) return true;
    if (!p.empty() && p.back() == '*' &&
        absl::StartsWith(principal, absl::string_view(p).substr(0, p.size() - 1))) {
      return true;
    }
  }
  return false;
}

CallAuthenticator::CallAuthenticator(AuthOptions options, Clock* clock)
    : options_(std::move(options)), clock_(clock) {}

absl::StatusOr<std::shared_ptr<CallAuthenticator>> CallAuthenticator::Create(AuthOptions options,
                                                                             Clock* clock) {
  static RealClock real_clock;  // stateless
  options.required = options.required || !options.ca.empty() || !options.tokens.empty();
  std::shared_ptr<CallAuthenticator> a(
      new CallAuthenticator(std::move(options), clock != nullptr ? clock : &real_clock));
  TERN_RETURN_IF_ERROR(a->Reload(a->clock_->Now()));
  return a;
}

absl::Status CallAuthenticator::Reload(absl::Time now) {
  auto next = std::make_shared<Files>();
  if (!options_.ca.empty()) {
    TERN_ASSIGN_OR_RETURN(next->ca_text, ReadFile(options_.ca));
  }
  if (!options_.tokens.empty()) {
    TERN_ASSIGN_OR_RETURN(next->tokens_text, ReadFile(options_.tokens));
  }
  {
    absl::MutexLock lock(&mu_);
    checked_ = now;
    if (files_ != nullptr && files_->ca_text == next->ca_text &&
        files_->tokens_text == next->tokens_text) {
      return absl::OkStatus();
    }
  }
  if (!options_.ca.empty()) {
    std::vector<X509Ptr> cas = ParsePem(next->ca_text);
    if (cas.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the CA bundle ", options_.ca, " holds no PEM certificate"));
    }
    next->store.reset(X509_STORE_new());
    for (const X509Ptr& ca : cas) X509_STORE_add_cert(next->store.get(), ca.get());
  }
  if (!options_.tokens.empty()) {
    TERN_ASSIGN_OR_RETURN(next->tokens, ParseTokens(options_.tokens, next->tokens_text));
  }
  absl::MutexLock lock(&mu_);
  const bool first = files_ == nullptr;
  files_ = std::move(next);
  if (!first) spdlog::info("authentication: re-read {} {}", options_.ca, options_.tokens);
  return absl::OkStatus();
}

std::shared_ptr<const CallAuthenticator::Files> CallAuthenticator::Current() {
  const absl::Time now = clock_->Now();
  bool due;
  {
    absl::MutexLock lock(&mu_);
    due = now - checked_ >= options_.refresh;
    if (due) checked_ = now;  // one caller re-reads; the others go on with what is there
  }
  if (due) {
    if (absl::Status s = Reload(now); !s.ok()) {
      spdlog::warn("authentication: keeping the files read before: {}", std::string(s.message()));
    }
  }
  absl::MutexLock lock(&mu_);
  return files_;
}

namespace {

// The holder of a verified certificate, or UNAUTHENTICATED saying what is wrong with it.
absl::StatusOr<std::pair<std::string, absl::Time>> VerifyCertificate(X509_STORE* store,
                                                                     const std::string& pem,
                                                                     const std::string& chain,
                                                                     absl::Time now,
                                                                     const char** reason) {
  *reason = "bad_certificate";
  std::vector<X509Ptr> leaf = ParsePem(pem);
  if (leaf.empty()) return absl::UnauthenticatedError("the client certificate does not parse");
  StackPtr untrusted(sk_X509_new_null());
  for (X509Ptr& c : ParsePem(chain)) sk_X509_push(untrusted.get(), c.release());
  std::unique_ptr<X509_STORE_CTX, StoreCtxDeleter> ctx(X509_STORE_CTX_new());
  X509* cert = leaf.front().get();
  if (ctx == nullptr || X509_STORE_CTX_init(ctx.get(), store, cert, untrusted.get()) != 1) {
    return absl::InternalError("cannot set up certificate verification");
  }
  X509_VERIFY_PARAM_set_time(X509_STORE_CTX_get0_param(ctx.get()), absl::ToTimeT(now));
  X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_CLIENT);
  const std::string cn = CommonName(cert);
  const std::string who = absl::StrCat("the client certificate (CN=", cn, ")");
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    switch (err) {
      case X509_V_ERR_CERT_HAS_EXPIRED:
        *reason = "expired";
        return absl::UnauthenticatedError(
            absl::StrCat(who, " expired at ", absl::FormatTime(NotAfter(cert)),
                         ": renew it (tern certs makes a development one)"));
      case X509_V_ERR_CERT_NOT_YET_VALID:
        *reason = "not_yet_valid";
        return absl::UnauthenticatedError(absl::StrCat(who, " is not valid yet (clock skew?)"));
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
      case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
      case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
      case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
        *reason = "another_ca";
        return absl::UnauthenticatedError(absl::StrCat(
            who, " is not signed by this server's CA (--tls_ca): it comes from another CA"));
      default:
        return absl::UnauthenticatedError(
            absl::StrCat(who, " failed verification: ", X509_verify_cert_error_string(err)));
    }
  }
  if (cn.empty()) {
    return absl::UnauthenticatedError(
        "the client certificate names no holder (no common name): tern takes the holder's "
        "name from it");
  }
  return std::make_pair(cn, NotAfter(cert));
}

}  // namespace

absl::StatusOr<std::string> CallAuthenticator::Authenticate(const std::string& authorization,
                                                            const std::string& pem_cert,
                                                            const std::string& chain) {
  const char* reason = "";
  absl::StatusOr<std::string> holder = Check(authorization, pem_cert, chain, &reason);
  if (!holder.ok()) {
    absl::MutexLock lock(&counts_mu_);
    ++refusals_[reason];
  }
  return holder;
}

std::map<std::string, uint64_t> CallAuthenticator::RefusalsByReason() const {
  absl::MutexLock lock(&counts_mu_);
  return refusals_;
}

absl::StatusOr<std::string> CallAuthenticator::Check(const std::string& authorization,
                                                     const std::string& pem_cert,
                                                     const std::string& chain,
                                                     const char** reason) {
  const std::shared_ptr<const Files> files = Current();
  const absl::Time now = clock_->Now();
  std::string holder;
  if (!pem_cert.empty() && files->store != nullptr) {
    const std::string key = Sha256Hex(pem_cert);
    {
      absl::MutexLock lock(&files->cache_mu);
      auto it = files->verified.find(key);
      if (it != files->verified.end() && now < it->second.second) holder = it->second.first;
    }
    if (holder.empty()) {
      TERN_ASSIGN_OR_RETURN(auto verified,
                            VerifyCertificate(files->store.get(), pem_cert, chain, now, reason));
      holder = verified.first;
      absl::MutexLock lock(&files->cache_mu);
      if (files->verified.size() >= kMaxCachedCertificates) files->verified.clear();
      files->verified[key] = std::move(verified);
    }
  }
  if (!authorization.empty()) {
    absl::string_view token = authorization;
    if (!absl::ConsumePrefix(&token, "Bearer ") || token.empty()) {
      *reason = "bad_header";
      return absl::UnauthenticatedError("the authorization header is not 'Bearer TOKEN'");
    }
    if (options_.tokens.empty()) {
      *reason = "tokens_not_taken";
      return absl::UnauthenticatedError(
          "this server takes no bearer tokens (it has no --tokens file): drop --token_file");
    }
    auto it = files->tokens.find(Sha256Hex(token));
    if (it == files->tokens.end()) {
      *reason = "unknown_token";
      return absl::UnauthenticatedError(
          "an unknown bearer token: revoked, or not in this server's --tokens file");
    }
    return it->second;  // the token names the caller; a certificate only had to verify
  }
  if (!holder.empty() || !options_.required) return holder;
  std::string takes;
  if (files->store != nullptr) takes = "a client certificate from its CA (--tls_cert/--tls_key)";
  if (!options_.tokens.empty()) {
    absl::StrAppend(&takes, takes.empty() ? "" : " or ", "a bearer token (--token_file)");
  }
  *reason = "no_credentials";
  return absl::UnauthenticatedError(
      absl::StrCat("no credentials: this server takes ", takes, " (tern certs, tern tokens)"));
}

grpc::Status CallAuthenticator::Process(const InputMetadata& auth_metadata,
                                        grpc::AuthContext* context,
                                        OutputMetadata* consumed_auth_metadata,
                                        OutputMetadata* response_metadata) {
  std::string authorization;
  if (auto it = auth_metadata.find("authorization"); it != auth_metadata.end()) {
    authorization.assign(it->second.data(), it->second.size());
    consumed_auth_metadata->emplace("authorization", authorization);
  }
  auto first = [&](const char* property) {
    const std::vector<grpc::string_ref> v = context->FindPropertyValues(property);
    return v.empty() ? std::string() : std::string(v.front().data(), v.front().size());
  };
  absl::StatusOr<std::string> holder =
      Authenticate(authorization, first(GRPC_X509_PEM_CERT_PROPERTY_NAME),
                   first(GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME));
  if (!holder.ok()) {
    spdlog::warn("refused a call: {}", std::string(holder.status().message()));
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(holder.status().message()));
  }
  if (!holder->empty()) {
    context->AddProperty(kPrincipalProperty, *holder);
    context->SetPeerIdentityPropertyName(kPrincipalProperty);
  }
  return grpc::Status::OK;
}

std::string TokenLine(const std::string& name, const std::string& token) {
  return absl::StrCat(name, " ", kDigestPrefix, Sha256Hex(token));
}

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("no random bytes for a token");
  }
  return absl::StrCat("tern_", absl::BytesToHexString(absl::string_view(
                                   reinterpret_cast<const char*>(bytes), sizeof(bytes))));
}

absl::Status MakeTokens(const std::string& dir, const std::vector<std::string>& names) {
  TERN_RETURN_IF_ERROR(MakeDirectory(dir));
  const std::string table = dir + "/tokens";
  std::map<std::string, std::string> lines;  // name -> line, kept in name order
  if (absl::StatusOr<std::string> old = ReadFile(table); old.ok()) {
    TERN_RETURN_IF_ERROR(ParseTokens(table, *old).status());
    for (absl::string_view line : absl::StrSplit(*old, '\n', absl::SkipWhitespace())) {
      if (line.front() == '#') continue;
      lines[std::string(line.substr(0, line.find(' ')))] = std::string(line);
    }
  }
  for (const std::string& name : names) {
    if (name.empty() || absl::StrContains(name, ' ') || absl::StrContains(name, '/')) {
      return absl::InvalidArgumentError(absl::StrCat("a token holder's name '", name,
                                                     "' must be non-empty, without spaces or /"));
    }
    TERN_ASSIGN_OR_RETURN(const std::string token, NewToken());
    const std::string path = absl::StrCat(dir, "/", name, ".token");
    TERN_RETURN_IF_ERROR(WriteSecret(path, token + "\n"));
    lines[name] = TokenLine(name, token);
  }
  std::string text = "# tern tokens: NAME sha256:HEX (digests only; each NAME.token holds one)\n";
  for (const auto& [name, line] : lines) absl::StrAppend(&text, line, "\n");
  return WriteFileAtomically(table, text);
}

}  // namespace tern
