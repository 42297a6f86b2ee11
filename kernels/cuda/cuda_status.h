// CUDA error handling for tern's device code: a cudaError_t becomes an absl::Status (and the
// sticky error is cleared), never an abort. Usable from .cu and .cc files alike.
#ifndef TERN_KERNELS_CUDA_CUDA_STATUS_H_
#define TERN_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tern::cuda {

inline absl::Status FromCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear the sticky error so later calls are not poisoned
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

}  // namespace tern::cuda

#define TERN_CUDA_RETURN_IF_ERROR(expr)                                       \
  do {                                                                        \
    ::absl::Status tern_cuda_status_ = ::tern::cuda::FromCuda((expr), #expr); \
    if (!tern_cuda_status_.ok()) return tern_cuda_status_;                    \
  } while (0)

#endif  // TERN_KERNELS_CUDA_CUDA_STATUS_H_
