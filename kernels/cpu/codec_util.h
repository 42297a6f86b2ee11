// Helpers shared by the CPU codecs: payload errors, scale checks, deterministic reductions and the
// write/accumulate loops that every dense decoder ends in. Internal to kernels/.
#ifndef TERN_KERNELS_CPU_CODEC_UTIL_H_
#define TERN_KERNELS_CPU_CODEC_UTIL_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/rng.h"
#include "kernels/codec.h"
#include "kernels/format/payload.h"

namespace tern::internal {

// Decodes whose output is at least this large write it with non-temporal stores where a SIMD
// path exists: such an output does not stay in cache anyway (glibc's memcpy switches at a few
// MiB for the same reason).
inline constexpr size_t kStreamingStoreBytes = size_t{16} << 20;

// Sum of squares with a fixed blocking (4096 elements per float partial, partials summed in
// double), so the result does not depend on the thread count.
double SumSquares(absl::Span<const float> x);
// Sum of |x| with the same blocking.
double SumAbs(absl::Span<const float> x);
// sum x, sum x^2 and max |x| in one pass (same blocking as above).
struct Moments {
  double sum = 0;
  double sum_squares = 0;
  float max_abs = 0;
};
Moments ComputeMoments(absl::Span<const float> x);

// Largest |x|; NaNs are skipped.
float MaxAbs(absl::Span<const float> x);

// Packs the IEEE sign bits of x[0..n) into ceil(n/8) bytes, LSB first (1 = negative, -0.0
// included). Unused high bits of the last byte are zero.
void PackSignBits(const float* x, size_t n, uint8_t* out);
// out[i] = value with its sign flipped where bit i of `signs` is set (one pass, no fill first).
void FillSigned(const uint8_t* signs, size_t n, float value, float* out);
// out[i] += value with its sign flipped where bit i of `signs` is set. With value = w * scale it
// adds the same bits as FillSigned(scale) then AddScaled(w): a product's rounding does not depend
// on the signs, so w * (±scale) is ±(w * scale).
void AddSigned(const uint8_t* signs, size_t n, float value, float* out);
// u[i] = Uniform01Lo(key, first + i) for i < n (vectorised; the same bits on every path).
void FillUniform01(RngKey key, uint32_t first, uint32_t n, float* u);

// kSignMasks.m[b][j] is bit j of byte b moved to bit 31 (the f32 sign), so a decoder ORs or XORs
// a sign byte into 8 values with lane-wise ops that vectorise.
struct SignMasks {
  uint32_t m[256][8];
};
constexpr SignMasks MakeSignMasks() {
  SignMasks t{};
  for (int b = 0; b < 256; ++b) {
    for (int j = 0; j < 8; ++j) t.m[b][j] = static_cast<uint32_t>((b >> j) & 1) << 31;
  }
  return t;
}
inline constexpr SignMasks kSignMasks = MakeSignMasks();
// out[i] += w * v[i].
void AddScaled(const float* v, size_t n, float w, float* out);

// out[i] (+)= weight * v[i] for dense decoders.
template <bool kAccumulate>
inline void Store(float* out, size_t i, float v, float weight) {
  if constexpr (kAccumulate) {
    out[i] += weight * v;
  } else {
    out[i] = v;
  }
}

// Number of bytes the encoder writes into `payload` after growing it to `n` without shrinking the
// capacity: resizing a string that already has size n is free, so steady-state encoding into the
// same EncodedTensor touches no allocator and no memset.
inline uint8_t* ResizePayload(std::string* payload, size_t n) {
  payload->resize(n);
  return reinterpret_cast<uint8_t*>(payload->data());
}

// Fills the common EncodedTensor header fields.
inline void SetHeader(const Codec& codec, absl::string_view params, size_t numel,
                      EncodedTensor* out) {
  out->codec.assign(codec.Name().data(), codec.Name().size());
  out->params.assign(params.data(), params.size());
  out->numel = numel;
}

// EncodeSelection's checks: the element count, k = codec.TopK(numel) entries, indices ascending
// and in range (InvalidArgument naming the codec otherwise: a caller's mistake, not bad bytes).
absl::Status CheckSelection(const Codec& codec, const TopKSelection& selection);

}  // namespace tern::internal

#endif  // TERN_KERNELS_CPU_CODEC_UTIL_H_
