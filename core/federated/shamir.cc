#include "core/federated/shamir.h"

#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/byte_io.h"

namespace tern {
namespace {

constexpr uint64_t kP = (uint64_t{1} << 61) - 1;
constexpr int kPieceBytes = 7;

uint64_t Reduce(unsigned __int128 v) {
  uint64_t r = static_cast<uint64_t>(v & kP) + static_cast<uint64_t>(v >> 61);
  r = (r & kP) + (r >> 61);
  return r >= kP ? r - kP : r;
}
uint64_t Add(uint64_t a, uint64_t b) {
  const uint64_t s = a + b;  // both < 2^61: no overflow
  return s >= kP ? s - kP : s;
}
uint64_t Sub(uint64_t a, uint64_t b) { return a >= b ? a - b : a + kP - b; }
uint64_t Mul(uint64_t a, uint64_t b) { return Reduce(static_cast<unsigned __int128>(a) * b); }
uint64_t Inverse(uint64_t a) {  // Fermat: a^(p-2)
  uint64_t result = 1, base = a, e = kP - 2;
  while (e > 0) {
    if (e & 1) result = Mul(result, base);
    base = Mul(base, base);
    e >>= 1;
  }
  return result;
}

// The polynomials through `shares` (the first `n` of them), evaluated at x.
std::array<uint64_t, kShamirPieces> Interpolate(absl::Span<const ShamirShare> shares, size_t n,
                                                uint64_t x) {
  std::array<uint64_t, kShamirPieces> out{};
  for (size_t i = 0; i < n; ++i) {
    uint64_t num = 1, den = 1;
    for (size_t j = 0; j < n; ++j) {
      if (j == i) continue;
      num = Mul(num, Sub(x, shares[j].x));
      den = Mul(den, Sub(shares[i].x, shares[j].x));
    }
    const uint64_t basis = Mul(num, Inverse(den));
    for (int k = 0; k < kShamirPieces; ++k) out[k] = Add(out[k], Mul(shares[i].y[k], basis));
  }
  return out;
}

absl::StatusOr<uint64_t> RandomElement() {
  for (;;) {
    uint64_t v = 0;
    if (absl::Status s = SecureRandom(absl::MakeSpan(reinterpret_cast<uint8_t*>(&v), 8)); !s.ok()) {
      return s;
    }
    v &= kP;
    if (v < kP) return v;  // rejects only 2^61 - 1 itself: uniform on the field
  }
}

}  // namespace

absl::StatusOr<std::vector<ShamirShare>> ShamirSplit(const Key32& secret, int threshold,
                                                     absl::Span<const uint64_t> xs) {
  if (threshold < 1 || static_cast<size_t>(threshold) > xs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a threshold of ", threshold, " for ", xs.size(), " shares"));
  }
  absl::flat_hash_set<uint64_t> seen;
  for (uint64_t x : xs) {
    if (x == 0 || x >= kP || !seen.insert(x).second) {
      return absl::InvalidArgumentError(absl::StrCat("share point ", x,
                                                     " is zero, repeated or "
                                                     "outside the field"));
    }
  }
  // coeffs[k][d]: piece k's polynomial, constant term the piece.
  std::array<std::vector<uint64_t>, kShamirPieces> coeffs;
  for (int k = 0; k < kShamirPieces; ++k) {
    coeffs[k].resize(static_cast<size_t>(threshold));
    uint64_t piece = 0;
    const int begin = k * kPieceBytes;
    for (int b = 0; b < kPieceBytes && begin + b < 32; ++b) {
      piece |= uint64_t{secret[static_cast<size_t>(begin + b)]} << (8 * b);
    }
    coeffs[k][0] = piece;
    for (int d = 1; d < threshold; ++d) {
      absl::StatusOr<uint64_t> r = RandomElement();
      if (!r.ok()) return r.status();
      coeffs[k][static_cast<size_t>(d)] = *r;
    }
  }
  std::vector<ShamirShare> shares(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    shares[i].x = xs[i];
    for (int k = 0; k < kShamirPieces; ++k) {  // Horner
      uint64_t acc = 0;
      for (int d = threshold - 1; d >= 0; --d) {
        acc = Add(Mul(acc, xs[i]), coeffs[k][static_cast<size_t>(d)]);
      }
      shares[i].y[k] = acc;
    }
  }
  for (auto& c : coeffs) std::memset(c.data(), 0, c.size() * sizeof(uint64_t));
  return shares;
}

absl::StatusOr<Key32> ShamirCombine(absl::Span<const ShamirShare> shares, int threshold) {
  if (threshold < 1 || shares.size() < static_cast<size_t>(threshold)) {
    return absl::FailedPreconditionError(
        absl::StrCat(shares.size(), " shares of a secret that ", "needs ", threshold));
  }
  absl::flat_hash_set<uint64_t> seen;
  for (const ShamirShare& s : shares) {
    if (s.x == 0 || s.x >= kP || !seen.insert(s.x).second) {
      return absl::InvalidArgumentError(absl::StrCat("share point ", s.x,
                                                     " is zero, repeated or "
                                                     "outside the field"));
    }
    for (uint64_t y : s.y) {
      if (y >= kP) return absl::InvalidArgumentError("a share value outside the field");
    }
  }
  const size_t t = static_cast<size_t>(threshold);
  for (size_t i = t; i < shares.size(); ++i) {
    if (Interpolate(shares, t, shares[i].x) != shares[i].y) {
      return absl::DataLossError(
          absl::StrCat("the share at x = ", shares[i].x, " disagrees with the others"));
    }
  }
  const std::array<uint64_t, kShamirPieces> pieces = Interpolate(shares, t, 0);
  Key32 secret{};
  for (int k = 0; k < kShamirPieces; ++k) {
    const int begin = k * kPieceBytes;
    const int bytes = begin + kPieceBytes <= 32 ? kPieceBytes : 32 - begin;
    if (pieces[k] >> (8 * bytes) != 0) {
      return absl::DataLossError("the shares rebuild no secret (a piece out of range)");
    }
    for (int b = 0; b < bytes; ++b) {
      secret[static_cast<size_t>(begin + b)] = static_cast<uint8_t>(pieces[k] >> (8 * b));
    }
  }
  return secret;
}

std::string EncodeShamirShare(const ShamirShare& share) {
  std::string out;
  ByteWriter w(&out);
  w.U64(share.x);
  for (uint64_t y : share.y) w.U64(y);
  return out;
}

absl::StatusOr<ShamirShare> DecodeShamirShare(std::string_view bytes) {
  if (bytes.size() != kShamirShareBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a Shamir share is ", kShamirShareBytes, " bytes, not ", bytes.size()));
  }
  ShamirShare s;
  ByteReader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  r.U64(&s.x);  // the length was checked: every read succeeds
  for (uint64_t& y : s.y) r.U64(&y);
  if (s.x == 0 || s.x >= kP)
    return absl::InvalidArgumentError("a Shamir share's x is 0 or too big");
  for (uint64_t y : s.y) {
    if (y >= kP) return absl::InvalidArgumentError("a Shamir share's value is outside the field");
  }
  return s;
}

}  // namespace tern
