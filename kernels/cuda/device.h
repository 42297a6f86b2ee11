// GPU discovery for tern's CUDA build: whether a usable device is present, and what it is. GPU
// tests call DeviceInfo() and skip with its message when there is none.
#ifndef TERN_KERNELS_CUDA_DEVICE_H_
#define TERN_KERNELS_CUDA_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"

namespace tern::cuda {

struct Device {
  int index = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  size_t memory_bytes = 0;
};

// The first CUDA device, or FailedPrecondition (with the driver's reason) when none is usable.
absl::StatusOr<Device> FirstDevice();

// Allocates `n` floats on the device, fills them with `value` in a kernel on a fresh stream, copies
// them back and checks them: a smoke test of the toolchain and driver.
absl::Status FillAndCheck(size_t n, float value);

}  // namespace tern::cuda

#endif  // TERN_KERNELS_CUDA_DEVICE_H_
