// Counter-based random numbers: the value for element i depends only on (seed, i), so a payload is
// identical whether it is encoded by one thread, many threads, or a GPU. The exact function is part
// of the wire format for randomk (docs/wire-format.md §Random numbers); do not change it without
// bumping randomk's encoding version.
//
// Thread-safety: everything here is pure and thread-safe.
#ifndef TERN_COMMON_RNG_H_
#define TERN_COMMON_RNG_H_

#include <cmath>
#include <cstdint>

namespace tern {

// "lowbias32" integer hash (a bijection on 32 bits with good avalanche).
constexpr uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// SplitMix64 finaliser, used to spread a user seed over both key words.
constexpr uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct RngKey {
  uint32_t k0;
  uint32_t k1;
};

// Key for (seed, stream): different streams of one seed are independent.
constexpr RngKey MakeRngKey(uint64_t seed, uint32_t stream = 0) {
  const uint64_t z = Mix64(seed ^ (uint64_t{stream} * 0xd1b54a32d192ed03ULL));
  return RngKey{static_cast<uint32_t>(z), static_cast<uint32_t>(z >> 32)};
}

// 32 random bits for counter `i` under `key`: one lowbias32 round over the low counter word,
// offset by a hash of the high word. Tensors have < 2^32 elements, so in a codec's loop the high
// word (and its hash) is constant and each element costs a single Mix32.
constexpr uint32_t Random32(RngKey key, uint64_t i) {
  return Mix32((static_cast<uint32_t>(i) ^ key.k0) +
               Mix32(static_cast<uint32_t>(i >> 32) ^ key.k1));
}

// Random32(key, i) for i < 2^32, in 32-bit arithmetic only so that loops over it vectorise.
constexpr uint32_t Random32Lo(RngKey key, uint32_t i) {
  return Mix32((i ^ key.k0) + Mix32(key.k1));
}
// (The int32 step lets compilers use the signed conversion SIMD units have.)
constexpr float Uniform01Lo(RngKey key, uint32_t i) {
  return static_cast<float>(static_cast<int32_t>(Random32Lo(key, i) >> 8)) * 0x1p-24f;
}

// Uniform float in [0, 1) with 24 random bits.
constexpr float Uniform01(RngKey key, uint64_t i) {
  return static_cast<float>(static_cast<int32_t>(Random32(key, i) >> 8)) * 0x1p-24f;
}

// Standard normal draw for index i (Box-Muller over counters 2i and 2i + 1).
inline float Normal(RngKey key, uint64_t i) {
  const float u1 = 1.0f - Uniform01(key, 2 * i);  // (0, 1]: log(u1) is finite
  const float u2 = Uniform01(key, 2 * i + 1);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
}

}  // namespace tern

#endif  // TERN_COMMON_RNG_H_
