// The one place tern builds a client channel: every stub of every daemon and client (gossip
// peers, the aggregator, the scheduler, a worker's trainer) gets its channel here, so transport
// settings and credentials are decided once.
//
// Thread-safety: pure functions; a grpc::Channel is itself thread-safe.
#ifndef TERN_CORE_RPC_CHANNEL_H_
#define TERN_CORE_RPC_CHANNEL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "grpcpp/grpcpp.h"

namespace tern {

// Channel arguments for every channel: short reconnect backoff (peers come back), message limits
// sized for 1 MiB chunks.
grpc::ChannelArguments TernChannelArguments();

// HTTP/2 settings for moving 1 MiB chunks, and a ping policy that lets peer channels keep
// alive, on every channel and every server (name, value).
std::vector<std::pair<std::string, int>> Http2Tuning();

enum class ChannelKind {
  kDefault,
  // A gossip peer's channel: keepalive pings every 2 s while pushes are open, so a silent peer
  // (a partition) is noticed in ~4 s and reconnected to when it is back.
  kPeer,
};

// gRPC's target for `target`: itself, or for a list "hostA:7000,hostB:7000" (an aggregator and
// its standby, say) their addresses as one ipv4: (or ipv6:) target, resolved now; MakeChannel
// keeps a connection to each that answers (gRPC's round_robin), so that when one goes the calls
// go to another (a standby listens only once it serves). Names that do not resolve are left out,
// with a warning.
std::string ChannelTarget(const std::string& target);

// A channel to `target` ("host:port", or a list of them: ChannelTarget) with
// TernChannelArguments(), secured by `credentials`
// (core/rpc/security.h: ChannelCredentialsFor); null is plaintext. Channels with the same
// arguments share one connection; a `connection` other than 0 gets a connection of its own (the
// streams of a striped push each use one).
std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& target, ChannelKind kind = ChannelKind::kDefault,
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr, int connection = 0);

}  // namespace tern

#endif  // TERN_CORE_RPC_CHANNEL_H_
