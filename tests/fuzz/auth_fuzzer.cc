// libFuzzer target for call authentication: the input is an authorization header, a client
// certificate and its chain (PEM, as gRPC hands them over), separated by NUL bytes, checked
// against a development CA and a tokens file. Every input must end in a holder or an
// UNAUTHENTICATED status, never a crash or a leak.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/rpc/auth.h"
#include "core/rpc/dev_certs.h"

namespace {
std::shared_ptr<tern::CallAuthenticator>* authenticator = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = "/tmp/tern-fuzz-auth-" + std::to_string(getpid());
  tern::DevCertOptions o;
  o.names = {"client"};
  if (!tern::MakeDevCertificates(dir, o).ok() || !tern::MakeTokens(dir, {"client"}).ok()) {
    std::abort();
  }
  tern::AuthOptions a;
  a.ca = dir + "/ca.crt";
  a.tokens = dir + "/tokens";
  auto made = tern::CallAuthenticator::Create(a);
  if (!made.ok()) std::abort();
  authenticator = new std::shared_ptr<tern::CallAuthenticator>(*made);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t a = in.find('\0');
  const size_t b = a == std::string::npos ? a : in.find('\0', a + 1);
  const std::string header = in.substr(0, a);
  const std::string pem = a == std::string::npos ? "" : in.substr(a + 1, b - a - 1);
  const std::string chain = b == std::string::npos ? "" : in.substr(b + 1);
  absl::StatusOr<std::string> who = (*authenticator)->Authenticate(header, pem, chain);
  if (!who.ok() && !absl::IsUnauthenticated(who.status())) std::abort();
  return 0;
}
