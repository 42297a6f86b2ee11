// absl::Status <-> grpc::Status at the RPC edge (both use the same numeric codes), so the data
// path speaks absl::Status and only service handlers and stubs see gRPC's type.
//
// Thread-safety: pure functions.
#ifndef TERN_CORE_RPC_STATUS_H_
#define TERN_CORE_RPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tern {

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace tern

#endif  // TERN_CORE_RPC_STATUS_H_
