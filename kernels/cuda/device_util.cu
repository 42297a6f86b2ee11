#include "kernels/cuda/device_util.cuh"

namespace tern::cuda::internal {

__global__ void SegmentTotalsKernel(const float* partial, size_t segments,
                                    size_t blocks_per_segment, size_t total_blocks, double* total) {
  for (size_t s = size_t{blockIdx.x} * blockDim.x + threadIdx.x; s < segments;
       s += size_t{gridDim.x} * blockDim.x) {
    double t = 0;
    const size_t end =
        (s + 1) * blocks_per_segment < total_blocks ? (s + 1) * blocks_per_segment : total_blocks;
    for (size_t b = s * blocks_per_segment; b < end; ++b) t += static_cast<double>(partial[b]);
    total[s] = t;
  }
}

__global__ void MaxAbsKernel(const float* x, size_t n, uint32_t* out) {
  uint32_t m = 0;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    m = max(m, AbsBits(x[i]));
  }
  for (int offset = 16; offset > 0; offset /= 2)
    m = max(m, __shfl_down_sync(0xffffffffu, m, offset));
  if ((threadIdx.x & 31) == 0) atomicMax(out, m);
}

__global__ void SegmentExtremaKernel(const float* x, size_t n, size_t segment, uint32_t* max_abs,
                                     float* lo, float* hi) {
  __shared__ uint32_t s_max[kThreads];
  __shared__ float s_lo[kThreads], s_hi[kThreads];
  const size_t segments = (n + segment - 1) / segment;
  for (size_t s = blockIdx.x; s < segments; s += gridDim.x) {
    const size_t begin = s * segment, end = begin + segment < n ? begin + segment : n;
    uint32_t m = 0;
    float a = x[begin], b = x[begin];
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float v = x[i];
      m = max(m, AbsBits(v));
      a = v < a ? v : a;  // std::min(a, v)
      b = b < v ? v : b;  // std::max(b, v)
    }
    s_max[threadIdx.x] = m;
    s_lo[threadIdx.x] = a;
    s_hi[threadIdx.x] = b;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) {
        s_max[threadIdx.x] = max(s_max[threadIdx.x], s_max[threadIdx.x + half]);
        const float ol = s_lo[threadIdx.x + half], oh = s_hi[threadIdx.x + half];
        if (ol < s_lo[threadIdx.x]) s_lo[threadIdx.x] = ol;
        if (s_hi[threadIdx.x] < oh) s_hi[threadIdx.x] = oh;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      if (max_abs != nullptr) max_abs[s] = s_max[0];
      if (lo != nullptr) lo[s] = s_lo[0];
      if (hi != nullptr) hi[s] = s_hi[0];
    }
    __syncthreads();
  }
}

}  // namespace tern::cuda::internal
