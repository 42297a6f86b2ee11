// hq.v1's wire format (docs/wire-format.md §hq.v1), hierarchical quantization: the k largest
// magnitudes of the input (all of it at ratio 1), split by magnitude into L tiers, each tier's
// magnitudes quantized on its own grid [lo, hi] with its own bit width, stochastically rounded.
//   scales: 2L floats, lo_j and hi_j of tier j (tier 0 the largest magnitudes), 0 <= lo <= hi
//   payload: u32 k | u8 L | L x u8 bits_j | u8 rice (0..31; 255: every position, k = numel) |
//            bitstream, per selected element in ascending position:
//              [Rice(gap, rice)] | tier (TierBits(L) bits) | sign (1) | code (bits_tier - 1)
//            zero padded to a byte.
// Decoded at the element: ±(lo + code · (hi − lo) / (2^(bits − 1) − 1)); zero elsewhere.
// Shared by the CPU codec (kernels/cpu/hq.cc) and any device one.
#ifndef TERN_KERNELS_FORMAT_HQ_H_
#define TERN_KERNELS_FORMAT_HQ_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern::format {

inline constexpr char kHqName[] = "hq.v1";
inline constexpr int kHqMaxTiers = 8;
inline constexpr int kHqMinBits = 2;  // a sign and one magnitude bit
inline constexpr int kHqMaxBits = 16;
inline constexpr uint8_t kHqEveryPosition = 255;

struct HqParams {
  double ratio = 0.1;
  std::vector<int> bits = {6, 4, 3, 2};  // per tier, tier 0 the largest magnitudes
  std::string Canonical() const;         // "ratio=0.1,bits=6-4-3-2"
  std::string Spec() const;
  int tiers() const { return static_cast<int>(bits.size()); }
};
// ratio in (0, 1]; bits "B0-B1-..." with 1..8 tiers, each in [2, 16].
absl::StatusOr<HqParams> ParseHqParams(SpecParams& p);

// Bits of a tier index among L tiers: ceil(log2 L) (0 for one tier).
int HqTierBits(int tiers);
// A tier's largest code: 2^(bits − 1) − 1.
inline uint32_t HqMaxCode(int bits) { return (uint32_t{1} << (bits - 1)) - 1; }
// The grid step of a tier, as encoder and decoder both compute it.
inline float HqStep(float lo, float hi, int bits) {
  return (hi - lo) / static_cast<float>(HqMaxCode(bits));
}

struct HqHeader {
  uint32_t k = 0;
  std::vector<int> bits;  // per tier
  uint8_t rice = 0;       // kHqEveryPosition: no gaps, every position
  const uint8_t* stream = nullptr;
  size_t stream_bytes = 0;
};
// The header, the scales (2L, finite, 0 <= lo <= hi) and the sizes that follow from them; the
// bitstream itself is checked as it is read.
absl::StatusOr<HqHeader> ReadHqHeader(const EncodedView& in);

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_HQ_H_
