// topk.v1, threshold.v1 and dgc.v1 on the device: the sparse layout of
// kernels/cpu/sparse_format.cc. Selection is by the bit pattern of |x| as in kernels/select.h;
// CUB's order-preserving DeviceSelect gives ascending indices directly, and the k-th largest
// key comes from a radix sort of a small candidate set (a strided sample bounds it from below
// first), so the selected set, and hence the payload, is exactly the CPU's. Top-k waits for the
// device once, for the candidates' count.
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cmath>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gpu_codec.h"
#include "kernels/format/sparse.h"

namespace tern::cuda {
namespace {

using internal::Arena;

struct AtLeast {
  const float* x;
  uint32_t min_key;
  __device__ bool operator()(uint32_t i) const { return internal::MagnitudeKey(x[i]) >= min_key; }
};

// AtLeast with the key still on the device (its high bits: `mask`), so no wait comes before it.
struct AtLeastAt {
  const float* x;
  const uint32_t* min_key;
  uint32_t mask;
  __device__ bool operator()(uint32_t i) const {
    return internal::MagnitudeKey(x[i]) >= (*min_key & mask);
  }
};

__global__ void GatherKeysKernel(const float* x, const uint32_t* idx, size_t count,
                                 uint32_t* keys) {
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < count;
       j += size_t{gridDim.x} * blockDim.x) {
    keys[j] = internal::MagnitudeKey(x[idx[j]]);
  }
}

__global__ void StridedKeysKernel(const float* x, size_t first, size_t stride, size_t count,
                                  uint32_t* keys) {
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < count;
       j += size_t{gridDim.x} * blockDim.x) {
    keys[j] = internal::MagnitudeKey(x[first + j * stride]);
  }
}

__global__ void GatherValuesKernel(const float* x, const uint32_t* idx, size_t count,
                                   float* values) {
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < count;
       j += size_t{gridDim.x} * blockDim.x) {
    values[j] = x[idx[j]];
  }
}

// eq[j] = 1 where candidate j's key equals *kth; *above += candidates with a larger key (one
// atomic a block).
__global__ void TieFlagsKernel(const uint32_t* keys, size_t count, const uint32_t* kth_at,
                               uint32_t* eq, unsigned long long* above) {
  __shared__ unsigned long long warp_sum[internal::kThreads / 32];
  const uint32_t kth = *kth_at;
  unsigned long long mine = 0;
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < count;
       j += size_t{gridDim.x} * blockDim.x) {
    eq[j] = keys[j] == kth;
    mine += keys[j] > kth;
  }
  for (int offset = 16; offset > 0; offset /= 2)
    mine += __shfl_down_sync(0xffffffffu, mine, offset);
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < blockDim.x / 32; ++w) mine += warp_sum[w];
    if (mine != 0) atomicAdd(above, mine);
  }
}

// keep[j]: key above kth, or one of the first k - above candidates equal to it (the lowest
// indices). kth and above are read on the device: nothing waits for them.
struct KeepTopK {
  const uint32_t* keys;
  const uint32_t* rank;  // exclusive prefix count of keys equal to kth
  const uint32_t* kth;
  const unsigned long long* above;
  unsigned long long k;
  __device__ bool operator()(uint32_t j) const {
    const uint32_t t = *kth;
    return keys[j] > t || (keys[j] == t && rank[j] < k - *above);
  }
};

__global__ void SparseCheckKernel(const uint32_t* idx, size_t k, size_t n, uint32_t* flag) {
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < k;
       j += size_t{gridDim.x} * blockDim.x) {
    if (idx[j] >= n || (j > 0 && idx[j] <= idx[j - 1])) atomicOr(flag, 1u);
  }
}

__global__ void SparseScatterKernel(const uint32_t* idx, const float* values, size_t k, float w,
                                    bool acc, float* out) {
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < k;
       j += size_t{gridDim.x} * blockDim.x) {
    internal::Store(out, idx[j], values[j], w, acc);
  }
}

// The device side of a sparse selection: candidates, keys, and CUB's temporary storage, laid
// out in the caller's scratch. Sizes are for the worst case (every element selected).
struct SelectBuffers {
  uint32_t* cand = nullptr;    // n candidate indices
  uint32_t* keys = nullptr;    // n keys (candidates' or a sample's)
  uint32_t* sorted = nullptr;  // n keys sorted descending; then the kept candidates' positions
  uint32_t* eq = nullptr;      // n tie flags, then their exclusive scan in `rank`
  uint32_t* rank = nullptr;
  uint32_t* count = nullptr;  // DeviceSelect's count
  uint32_t* kth = nullptr;    // the k-th largest candidate key
  unsigned long long* above = nullptr;
  uint8_t* payload = nullptr;  // 4 + 8n bytes
  void* temp = nullptr;
  size_t temp_bytes = 0;
};

size_t CubTempBytes(size_t n) {
  size_t select = 0, sort = 0, scan = 0;
  const int items = static_cast<int>(std::max<size_t>(n, 1));
  cub::DeviceSelect::If(nullptr, select, thrust::counting_iterator<uint32_t>(0),
                        static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), items,
                        AtLeast{nullptr, 0});
  size_t flagged = 0, at = 0;
  cub::DeviceSelect::If(nullptr, flagged, thrust::counting_iterator<uint32_t>(0),
                        static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), items,
                        KeepTopK{nullptr, nullptr, nullptr, nullptr, 0});
  cub::DeviceSelect::If(nullptr, at, thrust::counting_iterator<uint32_t>(0),
                        static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), items,
                        AtLeastAt{nullptr, nullptr, 0});
  cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<uint32_t*>(nullptr),
                                static_cast<uint32_t*>(nullptr), items);
  cub::DeviceRadixSort::SortKeysDescending(nullptr, sort, static_cast<uint32_t*>(nullptr),
                                           static_cast<uint32_t*>(nullptr), items);
  return std::max({select, flagged, at, sort, scan});
}

Arena LayoutSelect(void* base, size_t bytes, size_t n, SelectBuffers* b) {
  Arena a(base, bytes);
  b->cand = a.Take<uint32_t>(n);
  b->keys = a.Take<uint32_t>(n);
  b->sorted = a.Take<uint32_t>(n);
  b->eq = a.Take<uint32_t>(n);
  b->rank = a.Take<uint32_t>(n);
  b->count = a.Take<uint32_t>(1);
  b->kth = a.Take<uint32_t>(1);
  b->above = a.Take<unsigned long long>(1);
  b->payload = a.Take<uint8_t>(4 + 8 * n);
  b->temp_bytes = CubTempBytes(n);
  b->temp = a.Take<uint8_t>(b->temp_bytes);
  return a;
}

// Selection steps, each enqueued on `stream`; the ones that return a count wait for it.
class Selector {
 public:
  Selector(const float* x, size_t n, SelectBuffers& b, cudaStream_t stream)
      : x_(x), n_(n), b_(b), stream_(stream) {}

  // Candidates with key >= min_key into b.cand (ascending); returns their count.
  absl::StatusOr<size_t> AtLeastKey(uint32_t min_key) {
    size_t temp = b_.temp_bytes;
    TERN_CUDA_RETURN_IF_ERROR(
        cub::DeviceSelect::If(b_.temp, temp, thrust::counting_iterator<uint32_t>(0), b_.cand,
                              b_.count, static_cast<int>(n_), AtLeast{x_, min_key}, stream_));
    uint32_t count = 0;
    TERN_RETURN_IF_ERROR(internal::ReadFlag(b_.count, stream_, &count));
    return size_t{count};
  }

  // Candidates with key >= (*d_min_key & mask) into b.cand (ascending); returns their count.
  absl::StatusOr<size_t> AtLeastKeyAt(const uint32_t* d_min_key, uint32_t mask) {
    size_t temp = b_.temp_bytes;
    TERN_CUDA_RETURN_IF_ERROR(cub::DeviceSelect::If(
        b_.temp, temp, thrust::counting_iterator<uint32_t>(0), b_.cand, b_.count,
        static_cast<int>(n_), AtLeastAt{x_, d_min_key, mask}, stream_));
    uint32_t count = 0;
    TERN_RETURN_IF_ERROR(internal::ReadFlag(b_.count, stream_, &count));
    return size_t{count};
  }

  // Enqueues a sort of `count` keys at b.keys, descending by their bits from `begin_bit` up;
  // returns where the r-th largest (0-based) will be (exact in its bits from begin_bit on).
  absl::StatusOr<const uint32_t*> NthLargestAt(size_t count, size_t r, int begin_bit = 0) {
    size_t temp = b_.temp_bytes;
    TERN_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeysDescending(
        b_.temp, temp, b_.keys, b_.sorted, static_cast<int>(count), begin_bit, 32, stream_));
    return b_.sorted + r;
  }

  // The r-th largest (0-based) of `count` keys at b.keys.
  absl::StatusOr<uint32_t> NthLargest(size_t count, size_t r) {
    TERN_ASSIGN_OR_RETURN(const uint32_t* at, NthLargestAt(count, r));
    uint32_t key = 0;
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&key, at, 4, cudaMemcpyDeviceToHost, stream_));
    TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return key;
  }

  // Keys of the first `count` candidates into b.keys.
  absl::Status CandidateKeys(size_t count) {
    if (count == 0) return absl::OkStatus();
    GatherKeysKernel<<<internal::GridFor(count), internal::kThreads, 0, stream_>>>(x_, b_.cand,
                                                                                   count, b_.keys);
    return internal::LaunchStatus("GatherKeysKernel");
  }

  // From `count` ascending candidates (a superset of the top k), the exact top k, ascending,
  // written as the payload's indices; returns k. (kernels/select.cc's TrimToTopK.)
  absl::StatusOr<size_t> TrimToTopK(size_t count, size_t k, uint32_t* out_idx) {
    TERN_RETURN_IF_ERROR(CandidateKeys(count));
    if (count <= k) {
      TERN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(out_idx, b_.cand, 4 * count, cudaMemcpyDeviceToDevice, stream_));
      return count;
    }
    // The k-th key and the count above it stay on the device: nothing here waits for them.
    TERN_ASSIGN_OR_RETURN(const uint32_t* kth_at, NthLargestAt(count, k - 1));
    TERN_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(b_.kth, kth_at, 4, cudaMemcpyDeviceToDevice, stream_));
    TERN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b_.above, 0, sizeof(unsigned long long), stream_));
    TieFlagsKernel<<<internal::GridFor(count), internal::kThreads, 0, stream_>>>(
        b_.keys, count, b_.kth, b_.eq, b_.above);
    TERN_RETURN_IF_ERROR(internal::LaunchStatus("TieFlagsKernel"));
    size_t temp = b_.temp_bytes;
    TERN_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(b_.temp, temp, b_.eq, b_.rank,
                                                            static_cast<int>(count), stream_));
    // Positions j of the kept candidates, ascending (exactly k of them), then mapped to their
    // indices.
    temp = b_.temp_bytes;
    TERN_CUDA_RETURN_IF_ERROR(cub::DeviceSelect::If(
        b_.temp, temp, thrust::counting_iterator<uint32_t>(0), b_.sorted, b_.count,
        static_cast<int>(count), KeepTopK{b_.keys, b_.rank, b_.kth, b_.above, k}, stream_));
    GatherValuesIdx(b_.sorted, k, out_idx);
    TERN_RETURN_IF_ERROR(internal::LaunchStatus("MapCandidates"));
    return k;
  }

  // Exact top k over all of x into out_idx (ascending); returns k.
  absl::StatusOr<size_t> TopK(size_t k, uint32_t* out_idx) {
    if (k == 0) return size_t{0};
    if (k >= n_) return AllThenCopy(out_idx);
    // A strided sample bounds the k-th largest key from below with a margin, as on the CPU.
    const size_t m = std::min(n_, std::max<size_t>(4096, n_ / 256));
    const size_t stride = std::max<size_t>(1, n_ / m);
    const size_t samples = (n_ - stride / 2 + stride - 1) / stride;
    StridedKeysKernel<<<internal::GridFor(samples), internal::kThreads, 0, stream_>>>(
        x_, stride / 2, stride, samples, b_.keys);
    TERN_RETURN_IF_ERROR(internal::LaunchStatus("StridedKeysKernel"));
    const double r = static_cast<double>(k) * samples / n_;
    const size_t q = std::min(samples - 1, static_cast<size_t>(r + 4 * std::sqrt(r) + 8));
    // Only a lower bound is needed: the high 16 bits of the q-th sampled key (half the sort's
    // passes), read on the device.
    TERN_ASSIGN_OR_RETURN(const uint32_t* bound, NthLargestAt(samples, q, /*begin_bit=*/16));
    TERN_ASSIGN_OR_RETURN(size_t count, AtLeastKeyAt(bound, 0xffff0000u));
    if (count < k) {  // the sample misled us: the exact k-th key over every element
      StridedKeysKernel<<<internal::GridFor(n_), internal::kThreads, 0, stream_>>>(x_, 0, 1, n_,
                                                                                   b_.keys);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("StridedKeysKernel"));
      TERN_ASSIGN_OR_RETURN(const uint32_t kth, NthLargest(n_, k - 1));
      TERN_ASSIGN_OR_RETURN(count, AtLeastKey(kth));
    }
    return TrimToTopK(count, k, out_idx);
  }

  absl::StatusOr<size_t> AllThenCopy(uint32_t* out_idx) {
    TERN_ASSIGN_OR_RETURN(const size_t count, AtLeastKey(0));
    TERN_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out_idx, b_.cand, 4 * count, cudaMemcpyDeviceToDevice, stream_));
    return count;
  }

  // Kept candidate positions -> indices.
  void GatherValuesIdx(const uint32_t* positions, size_t k, uint32_t* out_idx);

 private:
  const float* x_;
  const size_t n_;
  SelectBuffers& b_;
  cudaStream_t stream_;
};

__global__ void MapPositionsKernel(const uint32_t* cand, const uint32_t* positions, size_t k,
                                   uint32_t* out) {
  for (size_t j = size_t{blockIdx.x} * blockDim.x + threadIdx.x; j < k;
       j += size_t{gridDim.x} * blockDim.x) {
    out[j] = cand[positions[j]];
  }
}

void Selector::GatherValuesIdx(const uint32_t* positions, size_t k, uint32_t* out_idx) {
  if (k == 0) return;
  MapPositionsKernel<<<internal::GridFor(k), internal::kThreads, 0, stream_>>>(b_.cand, positions,
                                                                               k, out_idx);
}

enum class Kind { kTopK, kThreshold, kDgc };

uint32_t HostMagnitudeKey(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits & 0x7fffffffu;
}

class GpuSparseCodec final : public GpuCodec {
 public:
  GpuSparseCodec(Kind kind, const char* name, std::string spec, double ratio, double sample,
                 float tau)
      : kind_(kind),
        ratio_(ratio),
        sample_(sample),
        tau_(tau),
        name_(name),
        spec_(std::move(spec)) {}
  absl::string_view Name() const override { return name_; }
  std::string Spec() const override { return spec_; }

  size_t EncodeScratchBytes(size_t n) const override {
    SelectBuffers b;
    return LayoutSelect(nullptr, 0, n, &b).used();
  }
  absl::Status EncodeOnDevice(const float* d_x, size_t n, const EncodeOptions&, void* d_scratch,
                              size_t scratch_bytes, cudaStream_t stream,
                              DeviceEncoded* out) override {
    SelectBuffers b;
    if (!LayoutSelect(d_scratch, scratch_bytes, n, &b).fits()) {
      return internal::ScratchError(Name(), EncodeScratchBytes(n), scratch_bytes);
    }
    if (n > 0xffffffffULL) return absl::InvalidArgumentError(absl::StrCat(Name(), ": too large"));
    Selector sel(d_x, n, b, stream);
    uint32_t* idx = reinterpret_cast<uint32_t*>(b.payload + 4);
    size_t k = 0;
    if (n > 0) {
      switch (kind_) {
        case Kind::kTopK: {
          TERN_ASSIGN_OR_RETURN(k, sel.TopK(format::SparseK(ratio_, n), idx));
          break;
        }
        case Kind::kThreshold: {
          TERN_ASSIGN_OR_RETURN(k, sel.AtLeastKey(HostMagnitudeKey(tau_)));
          TERN_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(idx, b.cand, 4 * k, cudaMemcpyDeviceToDevice, stream));
          break;
        }
        case Kind::kDgc: {
          TERN_ASSIGN_OR_RETURN(k, Dgc(sel, b, d_x, n, stream, idx));
          break;
        }
      }
    }
    // Values after the k indices, the count before them.
    float* values = reinterpret_cast<float*>(b.payload + 4 + 4 * k);
    if (k > 0) {
      GatherValuesKernel<<<internal::GridFor(k), internal::kThreads, 0, stream>>>(d_x, idx, k,
                                                                                  values);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("GatherValuesKernel"));
    }
    const uint32_t k32 = static_cast<uint32_t>(k);
    uint8_t header[4];
    std::memcpy(header, &k32, 4);
    TERN_RETURN_IF_ERROR(internal::PutHeader(header, 4, b.payload, stream));
    *out = {.codec = name_,
            .params = spec_.substr(spec_.find(':') + 1),
            .numel = n,
            .d_payload = b.payload,
            .payload_bytes = 4 + 8 * k,
            .d_scales = nullptr,
            .num_scales = 0};
    return absl::OkStatus();
  }

  size_t DecodeScratchBytes(const EncodedView& in) const override {
    Arena a(nullptr, 0);
    a.Take<uint8_t>(in.payload.size());
    a.Take<uint32_t>(1);
    return a.used();
  }
  absl::Status CheckPayload(const EncodedView& in) const override {
    return format::ReadSparseHeader(name_, in).status();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate, float* d_out,
                          size_t n, void* d_scratch, size_t scratch_bytes,
                          cudaStream_t stream) const override {
    TERN_ASSIGN_OR_RETURN(const format::SparseHeader h, format::ReadSparseHeader(name_, in));
    const uint32_t k = h.k;
    Arena a(d_scratch, scratch_bytes);
    uint8_t* p = a.Take<uint8_t>(in.payload.size());
    uint32_t* d_flag = a.Take<uint32_t>(1);
    if (!a.fits()) return internal::ScratchError(Name(), DecodeScratchBytes(in), scratch_bytes);
    TERN_RETURN_IF_ERROR(internal::Upload(in, p, stream));
    const uint32_t* idx = reinterpret_cast<const uint32_t*>(p + 4);
    const float* values = reinterpret_cast<const float*>(p + 4 + 4 * size_t{k});
    if (k > 0) {
      TERN_RETURN_IF_ERROR(internal::CheckOnDevice(
          d_flag, stream, "SparseCheckKernel",
          [&] {
            SparseCheckKernel<<<internal::GridFor(k), internal::kThreads, 0, stream>>>(idx, k, n,
                                                                                       d_flag);
          },
          Name(), "an index is out of range or not ascending"));
    }
    if (!accumulate && n > 0) {
      TERN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_out, 0, n * sizeof(float), stream));
    }
    if (k > 0) {
      SparseScatterKernel<<<internal::GridFor(k), internal::kThreads, 0, stream>>>(
          idx, values, k, weight, accumulate, d_out);
      TERN_RETURN_IF_ERROR(internal::LaunchStatus("SparseScatterKernel"));
    }
    return FromCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

 private:
  // kernels/select.cc's SelectDgc, step for step.
  absl::StatusOr<size_t> Dgc(Selector& sel, SelectBuffers& b, const float* d_x, size_t n,
                             cudaStream_t stream, uint32_t* idx) {
    const size_t k = format::SparseK(ratio_, n);
    if (k >= n) return sel.AllThenCopy(idx);
    const size_t m = std::min(n, std::max<size_t>(64, static_cast<size_t>(sample_ * n)));
    const size_t stride = std::max<size_t>(1, n / std::max<size_t>(1, m));
    const size_t samples = (n - stride / 2 + stride - 1) / stride;
    StridedKeysKernel<<<internal::GridFor(samples), internal::kThreads, 0, stream>>>(
        d_x, stride / 2, stride, samples, b.keys);
    TERN_RETURN_IF_ERROR(internal::LaunchStatus("StridedKeysKernel"));
    const size_t r =
        std::min(samples - 1, static_cast<size_t>(std::ceil(double(k) * samples / n)) - 1);
    TERN_ASSIGN_OR_RETURN(uint32_t key, sel.NthLargest(samples, r));
    for (int tries = 1;; ++tries) {
      TERN_ASSIGN_OR_RETURN(const size_t count, sel.AtLeastKey(key));
      if (count > k + 3 * k / 10) return sel.TrimToTopK(count, k, idx);
      if (10 * count >= 8 * k || tries == 10 || key == 0) {
        TERN_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(idx, b.cand, 4 * count, cudaMemcpyDeviceToDevice, stream));
        return count;
      }
      float f;
      std::memcpy(&f, &key, 4);
      key = HostMagnitudeKey(f * 0.8f);
    }
  }

  const Kind kind_;
  const double ratio_, sample_;
  const float tau_;
  std::string name_, spec_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuTopKCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::TopKParams p, format::ParseTopKParams(params));
  return std::make_unique<GpuSparseCodec>(Kind::kTopK, format::kTopKName, p.Spec(), p.ratio, 0, 0);
}
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuThresholdCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::ThresholdParams p, format::ParseThresholdParams(params));
  return std::make_unique<GpuSparseCodec>(Kind::kThreshold, format::kThresholdName, p.Spec(), 0, 0,
                                          p.tau);
}
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuDgcCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::DgcParams p, format::ParseDgcParams(params));
  return std::make_unique<GpuSparseCodec>(Kind::kDgc, format::kDgcName, p.Spec(), p.ratio, p.sample,
                                          0);
}

}  // namespace tern::cuda
