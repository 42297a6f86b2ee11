// GPU codec throughput on a CUDA device, against device copies measured in the same run, for n
// floats:
//   dev     GpuCodec::EncodeOnDevice: the kernels, the payload left in device memory; against a
//           device-to-device copy of the n floats (dev/d2d: how many such copies one encode costs
//           the inverse of);
//   pinned  EncodeOnDevice, then the payload and scales to pinned host memory (one DMA);
//   enc     GpuCodec::Encode: the same, into pageable memory (its std::string), against a
//           device-to-host copy of as many bytes from pageable memory (enc/d2h);
//   dec     the payload (host) to the device, validated, decoded into d_out.
//
//   tern_gpu_bench [N_FLOATS] [REPEATS] [SPEC]   (64M floats, 10 repeats, every codec; medians)
//
// SPEC, when given, runs only the codecs whose spec starts with it (one to profile).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "kernels/cuda/gpu_codec.h"
#include "tests/testing/data.h"

namespace {

// Median seconds of `repeats` runs of `f` (after one warm-up), each ended by a device sync.
template <typename F>
double Median(int repeats, F f) {
  f();
  cudaDeviceSynchronize();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const absl::Time t0 = absl::Now();
    f();
    cudaDeviceSynchronize();
    t.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{64} << 20;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 10;
  const std::string only = argc > 3 ? argv[3] : "";
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    std::fprintf(stderr, "tern_gpu_bench: no CUDA device\n");
    return 77;
  }
  std::printf("%s, %zu floats (%.0f MB), %d repeats, medians\n", prop.name, n, 4e-6 * n, repeats);
  const std::vector<float> x = tern::testing::Gaussian(n, 7);
  float *d_x = nullptr, *d_y = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d_x), 4 * n);
  cudaMalloc(reinterpret_cast<void**>(&d_y), 4 * n);
  cudaMemcpy(d_x, x.data(), 4 * n, cudaMemcpyHostToDevice);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  const double d2d =
      Median(repeats, [&] { cudaMemcpyAsync(d_y, d_x, 4 * n, cudaMemcpyDeviceToDevice, stream); });
  std::printf("anchor: device-to-device copy %.3f ms (%.0f GB/s of input)\n\n", 1e3 * d2d,
              4e-9 * n / d2d);
  std::printf("%-24s %10s %8s %8s %9s %8s %8s %8s %8s\n", "codec", "payload MB", "dev ms",
              "dev/d2d", "pinned ms", "enc ms", "enc/d2h", "dec ms", "dec GB/s");
  auto registry = tern::cuda::NewBuiltinGpuCodecRegistry();
  const char* specs[] = {"fp16",
                         "bf16",
                         "int8",
                         "int8:round=stochastic",
                         "sign",
                         "terngrad",
                         "natural",
                         "topk:ratio=0.001",
                         "dgc:ratio=0.001",
                         "threshold:tau=3",
                         "randomk:ratio=0.001"};
  for (const char* spec : specs) {
    if (std::string(spec).rfind(only, 0) != 0) continue;
    auto codec = registry->Create(spec);
    if (!codec.ok()) {
      std::printf("%-30s %s\n", spec, codec.status().ToString().c_str());
      continue;
    }
    const size_t scratch = (*codec)->EncodeScratchBytes(n);
    void* d_scratch = nullptr;
    cudaMalloc(&d_scratch, scratch);
    tern::EncodedTensor out;
    uint64_t seed = 1;
    bool ok = true;
    tern::cuda::DeviceEncoded on_device;
    const double kernels = Median(repeats, [&] {
      tern::EncodeOptions options;
      options.seed = seed++;
      ok &= (*codec)->EncodeOnDevice(d_x, n, options, d_scratch, scratch, stream, &on_device).ok();
    });
    void* pinned = nullptr;
    cudaMallocHost(&pinned, scratch);
    const double to_pinned = Median(repeats, [&] {
      tern::EncodeOptions options;
      options.seed = seed++;
      ok &= (*codec)->EncodeOnDevice(d_x, n, options, d_scratch, scratch, stream, &on_device).ok();
      cudaMemcpyAsync(pinned, on_device.d_payload, on_device.payload_bytes, cudaMemcpyDeviceToHost,
                      stream);
      if (on_device.num_scales > 0) {
        cudaMemcpyAsync(static_cast<char*>(pinned) + on_device.payload_bytes, on_device.d_scales,
                        4 * on_device.num_scales, cudaMemcpyDeviceToHost, stream);
      }
      cudaStreamSynchronize(stream);
    });
    const double enc = Median(repeats, [&] {
      tern::EncodeOptions options;
      options.seed = seed++;
      ok &= (*codec)->Encode(d_x, n, options, d_scratch, scratch, stream, &out).ok();
    });
    std::string host(out.payload.size(), '\0');
    void* d_payload = nullptr;
    cudaMalloc(&d_payload, out.payload.size() + 1);
    const double d2h = Median(repeats, [&] {
      cudaMemcpyAsync(host.data(), d_payload, host.size(), cudaMemcpyDeviceToHost, stream);
      cudaStreamSynchronize(stream);
    });
    const tern::EncodedView view = tern::EncodedView::Of(out);
    auto decoder = registry->DecoderFor(out.codec);
    const size_t dscratch = (*decoder)->DecodeScratchBytes(view);
    void* d_dscratch = nullptr;
    cudaMalloc(&d_dscratch, dscratch);
    const double dec = Median(repeats, [&] {
      ok &= (*decoder)->Decode(view, 1.0f, false, d_y, n, d_dscratch, dscratch, stream).ok();
    });
    std::printf("%-24s %10.2f %8.3f %7.2fx %9.3f %8.3f %7.2fx %8.3f %8.0f%s\n", spec,
                1e-6 * out.ByteSize(), 1e3 * kernels, d2d / kernels, 1e3 * to_pinned, 1e3 * enc,
                d2h / enc, 1e3 * dec, 4e-9 * n / dec, ok ? "" : "  (ERRORS)");
    cudaFreeHost(pinned);
    cudaFree(d_scratch);
    cudaFree(d_payload);
    cudaFree(d_dscratch);
  }
  return 0;
}
