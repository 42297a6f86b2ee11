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

__global__ void LongSegmentTotalsKernel(TotalsOf sums, size_t segments, size_t blocks_per_segment,
                                        size_t total_blocks) {
  constexpr int kTile = 4096;
  __shared__ float tile[kTile];
  const float* partial = sums.partial[blockIdx.y];
  for (size_t s = blockIdx.x; s < segments; s += gridDim.x) {
    const size_t first = s * blocks_per_segment;
    const size_t end =
        first + blocks_per_segment < total_blocks ? first + blocks_per_segment : total_blocks;
    double t = 0;
    for (size_t at = first; at < end; at += kTile) {
      const size_t len = end - at < kTile ? end - at : kTile;
      __syncthreads();
      for (size_t j = threadIdx.x; j < len; j += blockDim.x) tile[j] = partial[at + j];
      __syncthreads();
      // One thread adds them in order: the loads are the block's, the chain of adds its own,
      // sixteen values read ahead of their adds.
      if (threadIdx.x == 0) {
        size_t j = 0;
        for (; j + 16 <= len; j += 16) {
          double v[16];
#pragma unroll
          for (int q = 0; q < 16; ++q) v[q] = static_cast<double>(tile[j + q]);
#pragma unroll
          for (int q = 0; q < 16; ++q) t += v[q];
        }
        for (; j < len; ++j) t += static_cast<double>(tile[j]);
      }
    }
    if (threadIdx.x == 0) sums.total[blockIdx.y][s] = t;
  }
}

__global__ void PutHeaderKernel(uint8_t* dst, HeaderBytes header) {
  if (threadIdx.x < header.size) dst[threadIdx.x] = header.bytes[threadIdx.x];
}

__global__ void MaxAbsKernel(const float* x, size_t n, uint32_t* out) {
  __shared__ uint32_t warp_max[kThreads / 32];
  uint32_t m = 0;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    m = max(m, AbsBits(x[i]));
  }
  // One atomic a block: one a warp queued 65,536 of them on one word at 16M floats.
  for (int offset = 16; offset > 0; offset /= 2)
    m = max(m, __shfl_down_sync(0xffffffffu, m, offset));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < blockDim.x / 32; ++w) m = max(m, warp_max[w]);
    atomicMax(out, m);
  }
}

__global__ void MomentsKernel(const float* x, size_t n, size_t total_blocks, float* sum,
                              float* sum_sq, uint32_t* max_abs) {
  const int lane = threadIdx.x & 15;  // within its half-warp
  const size_t half = (threadIdx.x >> 4) & 1;
  const size_t warps = (size_t{gridDim.x} * blockDim.x) >> 5;
  uint32_t m = 0;
  // Each warp takes two blocks, one a half; the trip count is the warp's, so every shuffle has
  // the whole warp.
  for (size_t pair = (size_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5; 2 * pair < total_blocks;
       pair += warps) {
    const size_t w = 2 * pair + half;
    const size_t begin = w * kSumBlock;
    const size_t len = w >= total_blocks ? 0 : (begin + kSumBlock < n ? kSumBlock : n - begin);
    const size_t whole = len & ~size_t{15};
    float acc = 0.0f, acc_sq = 0.0f;
    for (size_t i = lane; i < whole; i += 16) {
      const float v = x[begin + i];
      acc = __fadd_rn(acc, v);
      acc_sq = __fadd_rn(acc_sq, __fmul_rn(v, v));
      m = max(m, AbsBits(v));
    }
    float lanes[16], lanes_sq[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      lanes[j] = __shfl_sync(0xffffffffu, acc, j, 16);
      lanes_sq[j] = __shfl_sync(0xffffffffu, acc_sq, j, 16);
    }
    if (lane == 0 && len > 0) {
      float s = 0.0f, s_sq = 0.0f;
      for (size_t i = whole; i < len; ++i) {
        const float v = x[begin + i];
        s = __fadd_rn(s, v);
        s_sq = __fadd_rn(s_sq, __fmul_rn(v, v));
        m = max(m, AbsBits(v));
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        s = __fadd_rn(s, lanes[j]);
        s_sq = __fadd_rn(s_sq, lanes_sq[j]);
      }
      sum[w] = s;
      sum_sq[w] = s_sq;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2)
    m = max(m, __shfl_down_sync(0xffffffffu, m, offset));
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(max_abs, m);
}

__global__ void ShortSegmentExtremaKernel(const float* x, size_t n, size_t segment,
                                          uint32_t* max_abs, float* lo, float* hi) {
  const int lane = threadIdx.x & 31;
  const size_t segments = (n + segment - 1) / segment;
  const size_t warps = (size_t{gridDim.x} * blockDim.x) >> 5;
  for (size_t s = (size_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5; s < segments; s += warps) {
    const size_t begin = s * segment, end = begin + segment < n ? begin + segment : n;
    uint32_t m = 0;
    float a = x[begin], b = x[begin];
    for (size_t i = begin + lane; i < end; i += 32) {
      const float v = x[i];
      m = max(m, AbsBits(v));
      a = v < a ? v : a;  // std::min(a, v)
      b = b < v ? v : b;  // std::max(b, v)
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      m = max(m, __shfl_down_sync(0xffffffffu, m, offset));
      const float oa = __shfl_down_sync(0xffffffffu, a, offset);
      const float ob = __shfl_down_sync(0xffffffffu, b, offset);
      if (oa < a) a = oa;
      if (b < ob) b = ob;
    }
    if (lane == 0) {
      if (max_abs != nullptr) max_abs[s] = m;
      if (lo != nullptr) lo[s] = a;
      if (hi != nullptr) hi[s] = b;
    }
  }
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
