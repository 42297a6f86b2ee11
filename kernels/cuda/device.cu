#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"

namespace tern::cuda {
namespace {

__global__ void FillKernel(float* dst, size_t n, float value) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = value;
  }
}

}  // namespace

absl::StatusOr<Device> FirstDevice() {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        err != cudaSuccess ? absl::StrCat("no usable CUDA device: ", cudaGetErrorString(err))
                           : std::string("no CUDA device present"));
  }
  cudaDeviceProp prop;
  TERN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  return Device{0, prop.name, prop.major, prop.minor, prop.totalGlobalMem};
}

absl::Status FillAndCheck(size_t n, float value) {
  float* d = nullptr;
  TERN_CUDA_RETURN_IF_ERROR(cudaMalloc(&d, n * sizeof(float)));
  cudaStream_t stream;
  absl::Status s = FromCuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  std::vector<float> host(n);
  if (s.ok()) {
    FillKernel<<<256, 256, 0, stream>>>(d, n, value);
    // Update, not `s = ...`: nvcc warns of a discarded [[nodiscard]] Status& from operator=.
    s.Update(FromCuda(cudaGetLastError(), "FillKernel launch"));
    if (s.ok()) {
      s.Update(FromCuda(
          cudaMemcpyAsync(host.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync"));
    }
    if (s.ok()) s.Update(FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    cudaStreamDestroy(stream);
  }
  cudaFree(d);
  if (!s.ok()) return s;
  for (size_t i = 0; i < n; ++i) {
    if (host[i] != value) return absl::InternalError(absl::StrCat("mismatch at ", i));
  }
  return absl::OkStatus();
}

}  // namespace tern::cuda
