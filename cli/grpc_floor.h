// What gRPC itself costs to move bytes on loopback, with nothing of tern's on top: a client
// stream of raw 1 MiB ByteBuffers (generic API: no protobuf, no CRC, no validation, the
// receiver keeps gRPC's slices without copying) into a server built with tern's HTTP/2 tuning.
// `tern bench transport` prints it beside the real push so the gap between the two is tern's
// and the gap between this and raw TCP is gRPC's.
//
// Thread-safety: GrpcFloor is used by one thread at a time; its server runs on gRPC's threads.
#ifndef TERN_CLI_GRPC_FLOOR_H_
#define TERN_CLI_GRPC_FLOOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace tern {

class GrpcFloor {
 public:
  // A loopback server and `connections` channels to it (each its own TCP connection).
  static absl::StatusOr<std::unique_ptr<GrpcFloor>> Start(int connections);
  ~GrpcFloor();

  // Seconds to stream `size` bytes from `data`, split evenly over the connections, one call
  // each, in 1 MiB messages; done when every call has finished OK (the server has read all).
  absl::StatusOr<double> Seconds(const char* data, size_t size);

 private:
  GrpcFloor() = default;

  std::unique_ptr<grpc::CallbackGenericService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
};

}  // namespace tern

#endif  // TERN_CLI_GRPC_FLOOR_H_
