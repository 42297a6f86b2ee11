// Addresses as tern's flags write them ("host:port", "[v6]:port") and as sockets take them: the
// split, the resolution and the text, in one place for the channel factory, the TLS check and
// `tern launch`.
//
// Thread-safety: pure functions (getaddrinfo is thread-safe).
#ifndef TERN_CORE_RPC_ADDRESS_H_
#define TERN_CORE_RPC_ADDRESS_H_

#include <sys/socket.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tern {

// "10.0.0.1:7000" -> {"10.0.0.1", "7000"}; "[fe80::1]:7000" -> {"fe80::1", "7000"} (no
// brackets); without a colon, all host and no port.
struct HostPort {
  std::string host;
  std::string port;
};
HostPort SplitHostPort(absl::string_view address);

// One socket address `getaddrinfo` gave.
struct SocketAddress {
  sockaddr_storage storage;
  socklen_t length;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
};

// Every address `at` resolves to, in the resolver's order, for sockets of `socktype`
// (SOCK_STREAM, SOCK_DGRAM) with getaddrinfo's `flags` (AI_PASSIVE: to bind); Unavailable with
// the resolver's reason when it gives none.
absl::StatusOr<std::vector<SocketAddress>> Resolve(const HostPort& at, int socktype, int flags = 0);

// An IPv4 or IPv6 address's IP as tern writes it before ":port": "10.0.0.1", "[fe80::1]".
std::string IpText(const sockaddr* address);

}  // namespace tern

#endif  // TERN_CORE_RPC_ADDRESS_H_
