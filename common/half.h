// IEEE binary16 and bfloat16 conversions, round-to-nearest-even, written branch-free so the
// compiler vectorises loops over them. Bit-identical to CUDA's __float2half_rn /
// __float2bfloat16_rn for finite values and infinities; NaN becomes a quiet NaN.
//
// Thread-safety: pure functions.
#ifndef TERN_COMMON_HALF_H_
#define TERN_COMMON_HALF_H_

#include <bit>
#include <cstdint>

namespace tern {

inline uint16_t FloatToHalf(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = bits & 0x80000000u;
  const uint32_t x = bits ^ sign;
  // Overflow or Inf -> Inf; NaN -> quiet NaN.
  const uint32_t big = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // Subnormal half (|f| < 2^-14): let the FPU round by adding a magic constant.
  const float denorm_magic = std::bit_cast<float>(((127u - 15u) + (23u - 10u) + 1u) << 23);
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(x) + denorm_magic) -
                       std::bit_cast<uint32_t>(denorm_magic);
  // Normal: rebias the exponent and round the mantissa to nearest even.
  const uint32_t mant_odd = (x >> 13) & 1u;
  const uint32_t norm = (x + ((15u - 127u) << 23) + 0xfffu + mant_odd) >> 13;
  uint32_t o = x >= ((127u + 16u) << 23) ? big : (x < (113u << 23) ? sub : norm);
  return static_cast<uint16_t>(o | (sign >> 16));
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  const uint32_t inf_nan = o + ((128u - 16u) << 23);
  const float magic = std::bit_cast<float>(113u << 23);
  const uint32_t denorm = std::bit_cast<uint32_t>(std::bit_cast<float>(o + (1u << 23)) - magic);
  o = exp == shifted_exp ? inf_nan : (exp == 0 ? denorm : o);
  return std::bit_cast<float>(o | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

inline uint16_t FloatToBfloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? ((x >> 16) | 0x40u) : rounded);
}

inline float Bfloat16ToFloat(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

}  // namespace tern

#endif  // TERN_COMMON_HALF_H_
