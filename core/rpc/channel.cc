#include "core/rpc/channel.h"

#include <sys/socket.h>

#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/rpc/address.h"
#include "spdlog/spdlog.h"

namespace tern {

namespace {

// host:port's address as gRPC's ipv4: / ipv6: schemes list it ("10.0.0.1:7000",
// "[fe80::1]:7000"), and its family; nullopt when the name does not resolve.
std::optional<std::pair<int, std::string>> ListEntry(const std::string& host_port) {
  const HostPort at = SplitHostPort(host_port);
  if (at.port.empty()) return std::nullopt;
  absl::StatusOr<std::vector<SocketAddress>> found = Resolve(at, SOCK_STREAM);
  if (!found.ok()) return std::nullopt;
  const SocketAddress& first = found->front();
  return std::make_pair(first.family(), absl::StrCat(IpText(first.get()), ":", at.port));
}

}  // namespace

std::string ChannelTarget(const std::string& target) {
  if (target.find(',') == std::string::npos || target.find("://") != std::string::npos ||
      absl::StartsWith(target, "ipv4:") || absl::StartsWith(target, "ipv6:")) {
    return target;
  }
  // One family a target: the first address's; others are left out.
  int family = AF_UNSPEC;
  std::vector<std::string> addresses;
  for (absl::string_view one : absl::StrSplit(target, ',', absl::SkipWhitespace())) {
    const std::string each(absl::StripAsciiWhitespace(one));
    std::optional<std::pair<int, std::string>> r = ListEntry(each);
    if (!r.has_value() || (family != AF_UNSPEC && r->first != family)) {
      spdlog::warn(
          "channel: {} (of {}) {}: left out", each, target,
          r.has_value() ? "is of another address family than the first" : "does not resolve");
      continue;
    }
    family = r->first;
    addresses.push_back(r->second);
  }
  if (addresses.empty()) return target;
  return absl::StrCat(family == AF_INET ? "ipv4:" : "ipv6:", absl::StrJoin(addresses, ","));
}

std::vector<std::pair<std::string, int>> Http2Tuning() {
  // Tensors stream as 1 MiB chunks: frames that carry a chunk whole, and a stream window that
  // lets several chunks be in flight before the receiver's first WINDOW_UPDATE (gRPC's 64 KiB
  // default stalls every new push on a fast link). That window stays fixed: gRPC's BDP probe
  // would resize it from its own estimate, which on a fast link starts small and held each new
  // push's first chunk back by 1-6 ms (tern bench transport, 4 MB: 0.56-0.61x -> 0.72-0.80x raw
  // TCP). A push then has 8 MiB in flight per stream, times --push_stripes: the rate x RTT of a
  // 1 Gbit/s link up to 64 ms away, per stream.
  //
  // Servers take a keepalive ping a second from a client with calls open (a gossip peer's
  // channel pings every 2 s: below); gRPC's default policy would answer that with GOAWAY.
  return {{GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (1 << 20) + (64 << 10)},
          {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20},
          {GRPC_ARG_HTTP2_BDP_PROBE, 0},
          {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000},
          {GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0}};
}

grpc::ChannelArguments TernChannelArguments() {
  grpc::ChannelArguments args;
  // A restarted peer is retried within 0.1-2 s. gRPC's "min reconnect backoff" is no backoff: it
  // is the least time one connection attempt (TCP, TLS and HTTP/2 handshakes) is given. At
  // 100 ms it cut mutual-TLS handshakes on a loaded host ("handshaker shutdown") and would cut
  // them over any link whose few round trips take longer; 5 s covers those, and a peer that
  // silently drops packets still costs a call no more than its own deadline.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetMaxReceiveMessageSize(4 << 20);
  for (const auto& [name, value] : Http2Tuning()) args.SetInt(name, value);
  return args;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, ChannelKind kind,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                                           int connection) {
  grpc::ChannelArguments args = TernChannelArguments();
  // gRPC reuses a connection for channels whose arguments are equal: this one's differ.
  if (connection != 0) args.SetInt("tern.connection", connection);
  if (kind == ChannelKind::kPeer) {
    // A connection whose peer went silent (a broken link, a partition: nothing is refused,
    // packets are lost) is closed 2 s after an unanswered ping, so pushes on it fail and the
    // channel connects afresh once the link is back, rather than wait on TCP retransmissions
    // that back off to minutes. Only while calls are open, and only on channels the callback
    // API polls (a blocking client that sleeps with calls open answers late and would be cut).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  const std::string resolved = ChannelTarget(target);
  if (resolved != target) {
    // TLS checks the certificates against the first address's host, as the user wrote it.
    args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, target.substr(0, target.find(',')));
    // Each address keeps its own connection attempts, and calls go to those that answer: with
    // pick_first, a dead first address's failures restarted the walk down the list, which cut
    // the attempt on a standby that had just come up ("handshaker shutdown"), over and over.
    args.SetLoadBalancingPolicyName("round_robin");
  }
  return grpc::CreateCustomChannel(resolved, credentials, args);
}

}  // namespace tern
