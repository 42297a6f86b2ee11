#include "core/rpc/server.h"

#include "absl/strings/str_cat.h"
#include "common/chunking.h"
#include "core/rpc/channel.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace tern {

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& listen, const std::vector<grpc::Service*>& services, int* port,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (credentials == nullptr) credentials = grpc::InsecureServerCredentials();
  builder.AddListeningPort(listen, credentials, port);
  // gRPC binds with SO_REUSEPORT by default: a second daemon on a port in use would start and
  // share the connections with the first, unseen. Refused instead ("cannot listen").
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (grpc::Service* s : services) builder.RegisterService(s);
  builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxChunkBytes + (64 << 10)));
  for (const auto& [name, value] : Http2Tuning()) builder.AddChannelArgument(name, value);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

void SetHealth(grpc::Server& server, const std::vector<std::string>& names, bool serving) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  for (const std::string& name : names) health->SetServingStatus(name, serving);
}

}  // namespace tern
