// randomk.v1's wire format (docs/wire-format.md §randomk.v1), shared by kernels/cpu/randomk.cc and
// kernels/cuda/randomk.cu: u64 seed | u32 k | k x f32 value (the values at the first k positions
// of a seeded permutation of [0, numel)); no scales. The permutation is here too, callable from
// host and device code, so both sides pick the same positions.
#ifndef TERN_KERNELS_FORMAT_RANDOMK_H_
#define TERN_KERNELS_FORMAT_RANDOMK_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/rng.h"
#include "common/spec.h"
#include "kernels/codec.h"

#if defined(__CUDACC__)
#define TERN_HOST_DEVICE __host__ __device__
#else
#define TERN_HOST_DEVICE
#endif

namespace tern::format {

inline constexpr char kRandomKName[] = "randomk.v1";
inline constexpr size_t kRandomKHeaderBytes = 12;

struct RandomKParams {
  double ratio = 0.01;
  bool unbiased = false;  // scale the kept values by d / k
  std::string Canonical() const;
  std::string Spec() const;
};
absl::StatusOr<RandomKParams> ParseRandomKParams(SpecParams& p);

void WriteRandomKHeader(uint64_t seed, uint32_t k, uint8_t* out);  // kRandomKHeaderBytes

struct RandomKHeader {
  uint64_t seed = 0;
  uint32_t k = 0;
  const uint8_t* values = nullptr;  // k x f32
};
absl::StatusOr<RandomKHeader> ReadRandomKHeader(const EncodedView& in);

// A 4-round Feistel network over 2h bits, h = max(1, ceil(log2(d)) / 2 rounded up), walked until
// the result falls in [0, d) (cycle walking keeps it a permutation of [0, d)). Position j of the
// payload is element RandomKPermutation::Make(seed, d)(j).
struct RandomKPermutation {
  RngKey key;
  uint64_t d;
  int half;
  uint32_t mask;

  static RandomKPermutation Make(uint64_t seed, uint64_t d) {
    RandomKPermutation p;
    p.key = MakeRngKey(seed, /*stream=*/0x52414e44);
    p.d = d;
    int bits = 2;
    if (d > 1) {
      bits = 0;
      for (uint64_t v = d - 1; v != 0; v >>= 1) ++bits;  // bit width of d - 1
    }
    bits += bits & 1;
    p.half = bits / 2;
    p.mask = (uint32_t{1} << p.half) - 1;
    return p;
  }
  TERN_HOST_DEVICE uint32_t Round(uint32_t x) const {
    uint32_t l = x >> half, r = x & mask;
    for (uint32_t round = 0; round < 4; ++round) {
      const uint32_t f = Random32(key, (uint64_t{round} << 32) | r) & mask;
      const uint32_t nl = r;
      r = l ^ f;
      l = nl;
    }
    return (l << half) | r;
  }
  TERN_HOST_DEVICE uint32_t operator()(uint32_t j) const {
    uint64_t x = j;
    do {
      x = Round(static_cast<uint32_t>(x));
    } while (x >= d);
    return static_cast<uint32_t>(x);
  }
};

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_RANDOMK_H_
