// Device-side helpers shared by the GPU codecs: the counter RNG (common/rng.h, whose constexpr
// functions compile for the device), IEEE half / bfloat16 conversions written like
// common/half.h, the CPU codecs' fixed-order reductions (kernels/cpu/codec_util.cc), a scratch
// arena and launch helpers. Internal to kernels/cuda/.
//
// Every arithmetic step that feeds a payload is written so that it rounds exactly as the CPU
// code does: the library is compiled with --fmad=false (no contraction) and reductions whose
// result depends on order (float sums) follow the CPU's order.
#ifndef TERN_KERNELS_CUDA_DEVICE_UTIL_CUH_
#define TERN_KERNELS_CUDA_DEVICE_UTIL_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "kernels/codec.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/format/payload.h"

namespace tern::cuda::internal {

// The payload errors and checks are the CPU codecs' (kernels/format/payload.h).
using ::tern::internal::PayloadError;

inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items (at most 64 per SM worth; enough to fill an H100).
inline unsigned GridFor(size_t n, int threads = kThreads) {
  const size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks > 8192 ? 8192 : blocks));
}

// Bump allocator over the caller's scratch buffer; with base == nullptr it only measures.
class Arena {
 public:
  Arena(void* base, size_t bytes) : base_(static_cast<char*>(base)), cap_(bytes) {}
  template <typename T>
  T* Take(size_t count) {
    used_ = (used_ + 255) & ~size_t{255};
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += count * sizeof(T);
    return p;
  }
  size_t used() const { return used_ + 256; }
  bool fits() const { return base_ != nullptr && used_ <= cap_; }

 private:
  char* base_;
  size_t cap_;
  size_t used_ = 0;
};

inline absl::Status ScratchError(absl::string_view codec, size_t need, size_t have) {
  return absl::InvalidArgumentError(
      absl::StrCat(codec, ": scratch of ", have, " bytes, need ", need));
}

inline absl::Status LaunchStatus(const char* what) { return FromCuda(cudaGetLastError(), what); }

// Copies host floats (scales) into device scratch.
inline absl::Status UploadFloats(absl::Span<const float> v, float* d_dst, cudaStream_t stream) {
  if (v.empty()) return absl::OkStatus();
  return FromCuda(
      cudaMemcpyAsync(d_dst, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (scales)");
}

// Copies the received payload bytes into device scratch.
inline absl::Status Upload(const EncodedView& in, void* d_dst, cudaStream_t stream) {
  if (in.payload.empty()) return absl::OkStatus();
  return FromCuda(
      cudaMemcpyAsync(d_dst, in.payload.data(), in.payload.size(), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (payload)");
}

// A payload's header, written on the host by its wire-format module, passed to a kernel by value
// so that writing it into the device payload waits for nothing.
struct HeaderBytes {
  uint8_t bytes[32];
  uint32_t size;
};
__global__ void PutHeaderKernel(uint8_t* dst, HeaderBytes header);

// Enqueues d_dst[0..size) = host[0..size) (size <= 32).
inline absl::Status PutHeader(const uint8_t* host, size_t size, void* d_dst, cudaStream_t stream) {
  HeaderBytes h{};
  if (size > sizeof(h.bytes)) return absl::InternalError("a header of over 32 bytes");
  std::memcpy(h.bytes, host, size);
  h.size = static_cast<uint32_t>(size);
  PutHeaderKernel<<<1, 32, 0, stream>>>(static_cast<uint8_t*>(d_dst), h);
  return LaunchStatus("PutHeaderKernel");
}

__device__ __forceinline__ uint32_t AbsBits(float v) {
  const uint32_t a = __float_as_uint(v) & 0x7fffffffu;
  return a > 0x7f800000u ? 0u : a;  // NaN counts as 0 (kernels/cpu/codec_util.cc)
}

// kernels/select.h's MagnitudeKey: NaN sorts above +Inf.
__device__ __forceinline__ uint32_t MagnitudeKey(float v) {
  return __float_as_uint(v) & 0x7fffffffu;
}

// common/half.h's FloatToHalf, bit for bit (including its NaN).
__device__ __forceinline__ uint16_t FloatToHalf(float f) {
  const uint32_t bits = __float_as_uint(f);
  const uint32_t sign = bits & 0x80000000u;
  const uint32_t x = bits ^ sign;
  const uint32_t big = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  const float denorm_magic = __uint_as_float(((127u - 15u) + (23u - 10u) + 1u) << 23);
  const uint32_t sub =
      __float_as_uint(__fadd_rn(__uint_as_float(x), denorm_magic)) - __float_as_uint(denorm_magic);
  const uint32_t mant_odd = (x >> 13) & 1u;
  const uint32_t norm = (x + ((15u - 127u) << 23) + 0xfffu + mant_odd) >> 13;
  const uint32_t o = x >= ((127u + 16u) << 23) ? big : (x < (113u << 23) ? sub : norm);
  return static_cast<uint16_t>(o | (sign >> 16));
}

__device__ __forceinline__ float HalfToFloat(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  const uint32_t inf_nan = o + ((128u - 16u) << 23);
  const float magic = __uint_as_float(113u << 23);
  const uint32_t denorm = __float_as_uint(__fsub_rn(__uint_as_float(o + (1u << 23)), magic));
  o = exp == shifted_exp ? inf_nan : (exp == 0 ? denorm : o);
  return __uint_as_float(o | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

__device__ __forceinline__ uint16_t FloatToBfloat16(float f) {
  const uint32_t x = __float_as_uint(f);
  const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? ((x >> 16) | 0x40u) : rounded);
}

__device__ __forceinline__ float Bfloat16ToFloat(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// out[i] (+)= weight * v, rounded as the CPU's Store<> (a product, then a sum).
__device__ __forceinline__ void Store(float* out, size_t i, float v, float weight, bool acc) {
  out[i] = acc ? __fadd_rn(out[i], __fmul_rn(weight, v)) : v;
}

// The CPU's fixed blocking for sums (kernels/cpu/codec_util.cc): blocks of 4096 elements, each
// summed in 16 float lane accumulators over whole groups of 16, then the tail into a fresh sum,
// then the 16 lanes in order; block partials are added in double, in block order.
inline constexpr size_t kSumBlock = 4096;

enum class SumOf { kAbs, kSquares, kValues };

template <SumOf kWhat>
__device__ __forceinline__ float Term(float v) {
  if constexpr (kWhat == SumOf::kAbs) return fabsf(v);
  if constexpr (kWhat == SumOf::kSquares) return __fmul_rn(v, v);
  return v;
}

// One warp per 4096-block of each segment: partial[b] = that block's float sum, in the CPU's
// order. Segments (chunks of `segment` elements; the last may be shorter) are blocked
// separately, so block b of segment s starts at s * segment + b * 4096.
template <SumOf kWhat>
__global__ void BlockPartialsKernel(const float* x, size_t n, size_t segment,
                                    size_t blocks_per_segment, size_t total_blocks,
                                    float* partial) {
  const int lane = threadIdx.x & 31;
  const size_t warps = (size_t{gridDim.x} * blockDim.x) >> 5;
  for (size_t w = (size_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5; w < total_blocks;
       w += warps) {
    const size_t s = w / blocks_per_segment, b = w % blocks_per_segment;
    const size_t seg_begin = s * segment;
    const size_t seg_end = seg_begin + segment < n ? seg_begin + segment : n;
    const size_t begin = seg_begin + b * kSumBlock;
    const size_t len = begin + kSumBlock < seg_end ? kSumBlock : seg_end - begin;
    const size_t whole = len & ~size_t{15};
    float acc = 0.0f;
    if (lane < 16) {
      for (size_t i = lane; i < whole; i += 16) acc = __fadd_rn(acc, Term<kWhat>(x[begin + i]));
    }
    // Gather the 16 lane sums to lane 0, which adds the tail first, then the lanes in order.
    float lanes[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) lanes[j] = __shfl_sync(0xffffffffu, acc, j);
    if (lane == 0) {
      float sum = 0.0f;
      for (size_t i = whole; i < len; ++i) sum = __fadd_rn(sum, Term<kWhat>(x[begin + i]));
#pragma unroll
      for (int j = 0; j < 16; ++j) sum = __fadd_rn(sum, lanes[j]);
      partial[w] = sum;
    }
  }
}

// total[s] = the double sum of segment s's block partials, in order (one thread a segment).
__global__ void SegmentTotalsKernel(const float* partial, size_t segments,
                                    size_t blocks_per_segment, size_t total_blocks, double* total);

// Blocks (of 4096) that segments of `segment` elements over n split into.
inline size_t BlocksPerSegment(size_t segment) { return (segment + kSumBlock - 1) / kSumBlock; }
inline size_t TotalBlocks(size_t n, size_t segment) {
  if (n == 0) return 0;
  const size_t segments = (n + segment - 1) / segment;
  const size_t last = n - (segments - 1) * segment;
  return (segments - 1) * BlocksPerSegment(segment) + BlocksPerSegment(last);
}

// Block partials and their totals, up to two sets (blockIdx.y picks one).
struct TotalsOf {
  const float* partial[2];
  double* total[2];
};
// The same sums for long segments: one block a segment loads its partials into shared memory,
// and one thread adds them in order (a thread alone waited on each load: 134 us at 4096).
__global__ void LongSegmentTotalsKernel(TotalsOf sums, size_t segments, size_t blocks_per_segment,
                                        size_t total_blocks);

// Enqueues the totals of `sets` (1 or 2) sets of block partials over segments of `segment`.
inline absl::Status SegmentTotals(TotalsOf sums, int sets, size_t n, size_t segment,
                                  cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  const size_t segments = (n + segment - 1) / segment;
  const size_t bps = BlocksPerSegment(segment);
  const size_t total_blocks = TotalBlocks(n, segment);
  if (bps >= 64) {
    const dim3 grid(static_cast<unsigned>(segments < 8192 ? segments : 8192),
                    static_cast<unsigned>(sets));
    LongSegmentTotalsKernel<<<grid, kThreads, 0, stream>>>(sums, segments, bps, total_blocks);
    return LaunchStatus("LongSegmentTotalsKernel");
  }
  for (int i = 0; i < sets; ++i) {
    SegmentTotalsKernel<<<GridFor(segments), kThreads, 0, stream>>>(sums.partial[i], segments, bps,
                                                                    total_blocks, sums.total[i]);
    TERN_RETURN_IF_ERROR(LaunchStatus("SegmentTotalsKernel"));
  }
  return absl::OkStatus();
}

// Enqueues totals[s] = CPU-order sum over segment s (scratch: TotalBlocks floats).
template <SumOf kWhat>
absl::Status SegmentSums(const float* d_x, size_t n, size_t segment, float* d_partial,
                         double* d_totals, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  const size_t bps = BlocksPerSegment(segment);
  // With a short last segment the block numbering above (s * bps + b) still holds: the last
  // segment simply has fewer blocks, all at the end.
  const size_t total_blocks = TotalBlocks(n, segment);
  const size_t threads = total_blocks * 32;
  BlockPartialsKernel<kWhat>
      <<<GridFor(threads), kThreads, 0, stream>>>(d_x, n, segment, bps, total_blocks, d_partial);
  TERN_RETURN_IF_ERROR(LaunchStatus("BlockPartialsKernel"));
  return SegmentTotals({.partial = {d_partial, nullptr}, .total = {d_totals, nullptr}}, 1, n,
                       segment, stream);
}

// One pass over x (a single segment) for terngrad's clip: sum[b] and sum_sq[b] = block b's sums
// of values and of squares in the CPU's order (as BlockPartialsKernel, a half-warp a block), and
// *max_abs = max(*max_abs, largest AbsBits) (zero it first).
__global__ void MomentsKernel(const float* x, size_t n, size_t total_blocks, float* sum,
                              float* sum_sq, uint32_t* max_abs);

// Per segment of `segment` elements, reductions that do not depend on order: the largest AbsBits
// (max_abs[s], as float bits) and, when lo/hi are given, the min and max value (CPU's
// std::min/std::max semantics for non-NaN input). One block per segment.
__global__ void SegmentExtremaKernel(const float* x, size_t n, size_t segment, uint32_t* max_abs,
                                     float* lo, float* hi);
// The same with one warp a segment, for segments of up to a few thousand elements (one block of
// 256 a segment spent most of int8's encode in its shared-memory reduction).
__global__ void ShortSegmentExtremaKernel(const float* x, size_t n, size_t segment,
                                          uint32_t* max_abs, float* lo, float* hi);

// Enqueues the per-segment extrema with the kernel that suits the segment's length.
inline absl::Status SegmentExtrema(const float* d_x, size_t n, size_t segment, uint32_t* max_abs,
                                   float* lo, float* hi, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  const size_t segments = (n + segment - 1) / segment;
  if (segment <= 8192) {
    ShortSegmentExtremaKernel<<<GridFor(segments * 32), kThreads, 0, stream>>>(d_x, n, segment,
                                                                               max_abs, lo, hi);
    return LaunchStatus("ShortSegmentExtremaKernel");
  }
  SegmentExtremaKernel<<<GridFor(segments * 256, 256), 256, 0, stream>>>(d_x, n, segment, max_abs,
                                                                         lo, hi);
  return LaunchStatus("SegmentExtremaKernel");
}

// *out = max(*out, largest AbsBits of x) (as float bits; zero *out first), over the whole grid.
__global__ void MaxAbsKernel(const float* x, size_t n, uint32_t* out);

// Validation flag helpers: a kernel sets *flag to a non-zero code on bad input; the host reads it.
inline absl::Status ReadFlag(const uint32_t* d_flag, cudaStream_t stream, uint32_t* flag) {
  TERN_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(flag, d_flag, sizeof(uint32_t), cudaMemcpyDeviceToHost, stream));
  return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

// The decoders' device-side check: clears *d_flag, runs `launch` (a check kernel named `kernel`
// that sets the flag on bad data), and turns a set flag into `codec`'s payload error `what`.
template <typename Launch>
absl::Status CheckOnDevice(uint32_t* d_flag, cudaStream_t stream, const char* kernel, Launch launch,
                           absl::string_view codec, absl::string_view what) {
  TERN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_flag, 0, 4, stream));
  launch();
  TERN_RETURN_IF_ERROR(LaunchStatus(kernel));
  uint32_t flag = 0;
  TERN_RETURN_IF_ERROR(ReadFlag(d_flag, stream, &flag));
  return flag == 0 ? absl::OkStatus() : PayloadError(codec, what);
}

}  // namespace tern::cuda::internal

#endif  // TERN_KERNELS_CUDA_DEVICE_UTIL_CUH_
