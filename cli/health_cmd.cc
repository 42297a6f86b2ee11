// tern health: asks a daemon's gRPC health service, as a container's health check or a script
// waiting for a daemon would (Debian ships no grpc_health_probe). Exit 0 when SERVING, 1 when
// NOT_SERVING or unknown, 2 when the daemon cannot be reached in time.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "cli/commands.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/service_flags.h"
#include "core/rpc/channel.h"
#include "core/rpc/status.h"
#include "grpc/health/v1/health.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:7070", "health: the daemon's HOST:PORT");
ABSL_FLAG(std::string, service, "",
          "health: a service's full name (tern.v1.Gossip, tern.v1.Trainer, tern.v1.Aggregator, "
          "tern.v1.Scheduler), or empty for the daemon as a whole");
ABSL_FLAG(tern::Double<tern::Above(0)>, timeout_s, 5, "health: seconds to wait for the answer");

namespace tern {

int HealthMain() {
  auto credentials = ChannelCredentialsFromFlags();
  if (!credentials.ok()) {
    std::printf("tern health: %s\n", credentials.status().ToString().c_str());
    return 2;
  }
  auto stub = grpc::health::v1::Health::NewStub(
      MakeChannel(absl::GetFlag(FLAGS_target), ChannelKind::kDefault, *credentials));
  grpc::ClientContext ctx;
  ctx.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s).value)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status s = stub->Check(&ctx, request, &response);
  const std::string what = request.service().empty() ? "the daemon" : request.service();
  if (!s.ok()) {
    std::printf("%s at %s: %s (%s)\n", what.c_str(), absl::GetFlag(FLAGS_target).c_str(),
                s.error_code() == grpc::StatusCode::NOT_FOUND ? "unknown service"
                : s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                        s.error_code() == grpc::StatusCode::PERMISSION_DENIED
                    ? "refused"
                    : "unreachable",
                std::string(FromGrpcStatus(s).message()).c_str());
    return s.error_code() == grpc::StatusCode::NOT_FOUND ? 1 : 2;
  }
  const std::string status =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  std::printf("%s at %s: %s\n", what.c_str(), absl::GetFlag(FLAGS_target).c_str(), status.c_str());
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace tern
