// GPU codecs: encoders and decoders that run on a CUDA device and produce and accept the same
// payloads as the CPU codecs (docs/wire-format.md), so a payload encoded on either side decodes
// on the other to the same values. Stochastic codecs draw from the same counter-based generator
// (common/rng.h), so with the same seed the payload bytes are identical to the CPU's.
//
// The host API follows CUB: the caller passes device pointers, a cudaStream_t and a scratch
// buffer it owns, sized by the matching *ScratchBytes query; nothing allocates device memory.
// CUDA errors come back as absl::Status, never an abort. Only the encoded payload crosses to the
// host (Encode ends with a copy into `out` and waits for the stream; EncodeOnDevice leaves it in
// device memory, for a caller that moves it on itself); Decode takes the payload as
// received (host memory), copies it to the scratch, validates it there completely and only then
// writes `d_out`, so a bad payload leaves d_out untouched.
//
// Thread-safety: like Codec, Encode is not thread-safe per instance; Decode is const. Calls on
// different streams with different scratch buffers may run concurrently.
#ifndef TERN_KERNELS_CUDA_GPU_CODEC_H_
#define TERN_KERNELS_CUDA_GPU_CODEC_H_

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/spec.h"
#include "kernels/codec.h"
#include "kernels/registry.h"

namespace tern::cuda {

// A payload encoded into device memory, inside the scratch it was encoded with (valid until that
// scratch is used again): the bytes Encode copies to the host, header included, and the scales.
struct DeviceEncoded {
  std::string codec;   // as EncodedTensor
  std::string params;  // as EncodedTensor
  uint64_t numel = 0;
  const void* d_payload = nullptr;
  size_t payload_bytes = 0;
  const float* d_scales = nullptr;
  size_t num_scales = 0;
};

class GpuCodec {
 public:
  virtual ~GpuCodec() = default;

  // The wire name, as the CPU codec's ("stc.v1"), and the spec that recreates it.
  virtual absl::string_view Name() const = 0;
  virtual std::string Spec() const = 0;

  // Scratch bytes Encode and EncodeOnDevice need for a tensor of n elements.
  virtual size_t EncodeScratchBytes(size_t n) const = 0;
  // Encodes the n floats at d_x (device memory) into d_scratch: `out` says where the payload
  // (header included, the bytes Encode would give) and the scales lie once `stream` gets there.
  // Enqueues on `stream` and returns without waiting for it, except where the codec needs an
  // answer from the data first (the sparse codecs' count; natural's Inf / NaN check).
  virtual absl::Status EncodeOnDevice(const float* d_x, size_t n, const EncodeOptions& options,
                                      void* d_scratch, size_t scratch_bytes, cudaStream_t stream,
                                      DeviceEncoded* out) = 0;
  // EncodeOnDevice, then CopyToHost: returns after the payload is on the host, in `out`.
  absl::Status Encode(const float* d_x, size_t n, const EncodeOptions& options, void* d_scratch,
                      size_t scratch_bytes, cudaStream_t stream, EncodedTensor* out);

  // Scratch bytes Decode needs for this payload (enough for any payload of in.numel elements
  // whose size is in.payload.size()).
  virtual size_t DecodeScratchBytes(const EncodedView& in) const = 0;
  // d_out[0..n) = decode(in) (accumulate == false) or += weight * decode(in). n must equal
  // in.numel. A malformed payload is InvalidArgument, with d_out untouched. Checks the codec
  // name and element count, then hands over to the codec, which reads the header once with the
  // same reader CheckPayload uses and validates the rest on the device before writing d_out.
  absl::Status Decode(const EncodedView& in, float weight, bool accumulate, float* d_out, size_t n,
                      void* d_scratch, size_t scratch_bytes, cudaStream_t stream) const;

  // The host-side checks of a payload for this codec (header, sizes, scales, padding), with the
  // same wire-format reader the CPU codec uses (kernels/format/): needs no device. What is left
  // for the device is data-dependent (codes, index order).
  virtual absl::Status CheckPayload(const EncodedView& in) const = 0;

 protected:
  // Codec-specific decoding, after the name and element count were checked; it validates the
  // payload itself (its wire-format reader on the host, then the data on the device).
  virtual absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                                  float* d_out, size_t n, void* d_scratch, size_t scratch_bytes,
                                  cudaStream_t stream) const = 0;
};

// Copies a payload encoded on the device to the host (`out`) and waits for `stream`.
absl::Status CopyToHost(const DeviceEncoded& in, cudaStream_t stream, EncodedTensor* out);

// GPU codecs by spec name, like CodecRegistry (the same template): Create("stc:ratio=0.001")
// gives the GPU encoder for what CodecRegistry::Create gives the CPU one (same parameters, same
// defaults, same errors); DecoderFor("stc.v1") decodes any such payload on the device.
//
// Thread-safety: Register before concurrent use; Create and DecoderFor are then thread-safe.
class GpuCodecRegistry final : public CodecRegistryOf<GpuCodec> {
 public:
  GpuCodecRegistry() : CodecRegistryOf<GpuCodec>("GPU codec") {}
};
using GpuCodecFactory = GpuCodecRegistry::Factory;

// A registry with every GPU codec.
std::unique_ptr<GpuCodecRegistry> NewBuiltinGpuCodecRegistry();

// Factories, one per codec file (kernels/cuda/<codec>.cu).
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuNoneCodec(SpecParams& params);
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuFp16Codec(SpecParams& params);
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuBf16Codec(SpecParams& params);
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuInt8Codec(SpecParams& params);
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuSignCodec(SpecParams& params);
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuTernGradCodec(SpecParams& params);
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuNaturalCodec(SpecParams& params);
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuTopKCodec(SpecParams& params);
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuThresholdCodec(SpecParams& params);
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuDgcCodec(SpecParams& params);
absl::StatusOr<std::unique_ptr<GpuCodec>> NewGpuRandomKCodec(SpecParams& params);

}  // namespace tern::cuda

#endif  // TERN_KERNELS_CUDA_GPU_CODEC_H_
