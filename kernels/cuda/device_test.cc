#include "kernels/cuda/device.h"

#include "gtest/gtest.h"

namespace tern::cuda {
namespace {

TEST(CudaDevice, FillRoundTripsThroughTheDevice) {
  auto device = FirstDevice();
  if (!device.ok()) GTEST_SKIP() << device.status().message();
  ASSERT_TRUE(FillAndCheck(1 << 20, 3.5f).ok());
}

}  // namespace
}  // namespace tern::cuda
