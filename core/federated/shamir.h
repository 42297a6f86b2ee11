// Shamir's secret sharing of a 32-byte secret over GF(2^61 - 1): the secret is cut into five
// 7-byte pieces (the last holds 4), each the constant term of its own random polynomial of degree
// t - 1; a share is the five polynomials at one x. Any t shares rebuild the secret; fewer say
// nothing about it. SecAgg+ shares each client's self-mask seed and mask key this way.
//
// A share's bytes (what a sealed share carries): x, then the five values, each a little-endian
// uint64 below 2^61 - 1 (48 bytes); x is never 0.
//
// Thread-safety: plain functions.
#ifndef TERN_CORE_FEDERATED_SHAMIR_H_
#define TERN_CORE_FEDERATED_SHAMIR_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/federated/secagg_crypto.h"

namespace tern {

inline constexpr int kShamirPieces = 5;
inline constexpr size_t kShamirShareBytes = 8 * (1 + kShamirPieces);

struct ShamirShare {
  uint64_t x = 0;
  std::array<uint64_t, kShamirPieces> y{};
};

// Shares of `secret` at each of `xs` (distinct, in 1..2^61 - 2), any `threshold` of which
// rebuild it (1 <= threshold <= xs.size()). The coefficients come from OpenSSL's CSPRNG.
absl::StatusOr<std::vector<ShamirShare>> ShamirSplit(const Key32& secret, int threshold,
                                                     absl::Span<const uint64_t> xs);

// The secret from at least `threshold` shares of distinct x. Shares beyond the first
// `threshold` must lie on the same polynomials: DataLoss otherwise (a share was damaged or lied
// about). A rebuilt piece too large to be a piece of a secret is DataLoss too.
absl::StatusOr<Key32> ShamirCombine(absl::Span<const ShamirShare> shares, int threshold);

std::string EncodeShamirShare(const ShamirShare& share);
// The 48 bytes EncodeShamirShare wrote; InvalidArgument for any other length, x = 0 or a value
// outside the field.
absl::StatusOr<ShamirShare> DecodeShamirShare(std::string_view bytes);

}  // namespace tern

#endif  // TERN_CORE_FEDERATED_SHAMIR_H_
