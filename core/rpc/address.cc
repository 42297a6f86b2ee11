#include "core/rpc/address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tern {

HostPort SplitHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  HostPort hp;
  absl::string_view host = colon == absl::string_view::npos ? address : address.substr(0, colon);
  if (colon != absl::string_view::npos) hp.port = std::string(address.substr(colon + 1));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  hp.host = std::string(host);
  return hp;
}

absl::StatusOr<std::vector<SocketAddress>> Resolve(const HostPort& at, int socktype, int flags) {
  addrinfo hints{};
  hints.ai_socktype = socktype;
  hints.ai_flags = flags;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(at.host.c_str(), at.port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", at.host, ": ", gai_strerror(rc)));
  }
  std::vector<SocketAddress> all;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    SocketAddress s{};
    std::memcpy(&s.storage, a->ai_addr, a->ai_addrlen);
    s.length = a->ai_addrlen;
    all.push_back(s);
  }
  freeaddrinfo(found);
  if (all.empty()) return absl::UnavailableError(absl::StrCat("cannot resolve ", at.host));
  return all;
}

std::string IpText(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text,
              sizeof(text));
    return text;
  }
  inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text,
            sizeof(text));
  return absl::StrCat("[", text, "]");
}

}  // namespace tern
