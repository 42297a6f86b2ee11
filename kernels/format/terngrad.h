// terngrad.v1's wire format (docs/wire-format.md §terngrad.v1), shared by kernels/cpu/terngrad.cc
// and kernels/cuda/terngrad.cu. Payload: u8 packing (0: 2-bit codes, 4 per byte; 1: base-3, 5 per
// byte) | packed codes with zero padding; scales: one (s, the clipped max |x|).
#ifndef TERN_KERNELS_FORMAT_TERNGRAD_H_
#define TERN_KERNELS_FORMAT_TERNGRAD_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern::format {

inline constexpr char kTernGradName[] = "terngrad.v1";
inline constexpr uint8_t kTernGrad2Bit = 0;
inline constexpr uint8_t kTernGradBase3 = 1;

struct TernGradParams {
  double clip = 2.5;  // clip |x| at clip * std (0: no clipping)
  uint8_t pack = kTernGrad2Bit;
  std::string Canonical() const;
  std::string Spec() const;
};
absl::StatusOr<TernGradParams> ParseTernGradParams(SpecParams& p);

// Bytes of packed codes for n values.
inline size_t TernGradPackedBytes(uint8_t pack, size_t n) {
  return pack == kTernGrad2Bit ? (n + 3) / 4 : (n + 4) / 5;
}

struct TernGradHeader {
  uint8_t pack = kTernGrad2Bit;
  size_t bytes = 0;               // packed code bytes
  const uint8_t* body = nullptr;  // codes not yet checked (2-bit code 3, byte >= 3^5)
};
// Packing, sizes, the scale and the last byte's padding; the codes themselves are checked by the
// decoder.
absl::StatusOr<TernGradHeader> ReadTernGradHeader(const EncodedView& in);

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_TERNGRAD_H_
