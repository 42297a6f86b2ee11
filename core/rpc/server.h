// Starting a tern gRPC server (worker daemon, aggregator, scheduler): one builder with health and
// reflection on and the message limit every tern service shares.
//
// Thread-safety: StartGrpcServer may be called from any thread.
#ifndef TERN_CORE_RPC_SERVER_H_
#define TERN_CORE_RPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace tern {

// Builds and starts a server for `services` on `listen` with the health (the server as a whole
// SERVING; a daemon sets its services' names) and reflection services on; `port` gets the bound
// port. A request is one chunk (<= 1 MiB of data) plus a small header, so that is the largest
// message taken.
// `credentials` (core/rpc/security.h: ServerCredentialsFor) secure the port; null is plaintext.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& listen, const std::vector<grpc::Service*>& services, int* port,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

// Sets the health status of each of `names` (a service's full name, e.g. "tern.v1.Gossip", or
// "" for the server as a whole), as grpc_health_probe and Kubernetes gRPC probes ask for it.
void SetHealth(grpc::Server& server, const std::vector<std::string>& names, bool serving);

}  // namespace tern

#endif  // TERN_CORE_RPC_SERVER_H_
