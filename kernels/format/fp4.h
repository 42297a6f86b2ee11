// fp4.v1's wire format (docs/wire-format.md §fp4.v1): 4-bit floats with one fp32 scale per block,
// for outer gradients (Streaming DiLoCo sends E3M0; e2m1 is the OCP microscaling element).
// Payload: u32 block | u8 element (0 e3m0, 1 e2m1) | ceil(numel / 2) bytes, two codes a byte
// (element 2i in the low nibble); scales: each block's max |x|. A code is a sign bit (bit 3)
// over a magnitude index m in [0, 7]: value = ±scale · Fp4Magnitudes(element)[m]; the negative
// zero code 0x8 and a non-zero padding nibble are invalid (one encoding per payload).
#ifndef TERN_KERNELS_FORMAT_FP4_H_
#define TERN_KERNELS_FORMAT_FP4_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern::format {

inline constexpr char kFp4Name[] = "fp4.v1";
inline constexpr size_t kFp4HeaderBytes = 5;
inline constexpr uint8_t kFp4E3M0 = 0;
inline constexpr uint8_t kFp4E2M1 = 1;

// Magnitudes as fractions of the block's max |x|, ascending, [0] = 0 and [7] = 1.
//   e3m0: 0, 2^-6, 2^-5, ..., 2^-1, 1 (sign and a 3-bit exponent, no mantissa; the zero exponent
//         is zero, not a subnormal);
//   e2m1: 0, 0.5, 1, 1.5, 2, 3, 4, 6, divided by 6.
using Fp4Table = std::array<float, 8>;
const Fp4Table& Fp4Magnitudes(uint8_t element);

struct Fp4Params {
  uint32_t block = 128;  // [1, 2^30]
  uint8_t element = kFp4E3M0;
  bool stochastic = false;
  std::string Canonical() const;  // "block=128,element=e3m0,round=nearest"
  std::string Spec() const;       // "fp4:" + Canonical()
  size_t Blocks(size_t n) const { return (n + block - 1) / block; }
};
// block (default 128), element=e3m0|e2m1, round=nearest|stochastic.
absl::StatusOr<Fp4Params> ParseFp4Params(SpecParams& p);

void WriteFp4Header(const Fp4Params& p, uint8_t* out);  // kFp4HeaderBytes

struct Fp4Header {
  uint32_t block = 0;
  uint8_t element = kFp4E3M0;
  size_t blocks = 0;
  const uint8_t* codes = nullptr;  // ceil(numel / 2) bytes, every nibble checked
};
// The whole payload: header, sizes, scales, codes (no 0x8 nibble, zero padding).
absl::StatusOr<Fp4Header> ReadFp4Header(const EncodedView& in);

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_FP4_H_
