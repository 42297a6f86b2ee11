#include "kernels/format/hq.h"

#include <bit>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/byte_io.h"
#include "common/status_macros.h"
#include "kernels/format/payload.h"

namespace tern::format {

std::string HqParams::Canonical() const {
  return absl::StrCat("ratio=", ratio, ",bits=", absl::StrJoin(bits, "-"));
}
std::string HqParams::Spec() const { return absl::StrCat("hq:", Canonical()); }

absl::StatusOr<HqParams> ParseHqParams(SpecParams& p) {
  HqParams o;
  TERN_ASSIGN_OR_RETURN(o.ratio, p.Double("ratio", 0.1, 1e-9, 1.0));
  const std::string bits = p.String("bits", "6-4-3-2");
  o.bits.clear();
  for (absl::string_view b : absl::StrSplit(bits, '-')) {
    int v = 0;
    if (!absl::SimpleAtoi(b, &v) || v < kHqMinBits || v > kHqMaxBits) {
      return absl::InvalidArgumentError(
          absl::StrCat("hq: bits=", bits, ": each tier's bits in [", kHqMinBits, ", ", kHqMaxBits,
                       "], tiers joined by '-' (largest magnitudes first: 6-4-3-2)"));
    }
    o.bits.push_back(v);
  }
  if (o.bits.empty() || o.tiers() > kHqMaxTiers) {
    return absl::InvalidArgumentError(
        absl::StrCat("hq: bits=", bits, ": 1 to ", kHqMaxTiers, " tiers"));
  }
  return o;
}

int HqTierBits(int tiers) {
  return tiers <= 1 ? 0 : std::bit_width(static_cast<unsigned>(tiers - 1));
}

absl::StatusOr<HqHeader> ReadHqHeader(const EncodedView& in) {
  ByteReader r(in.payload.data(), in.payload.size());
  HqHeader h;
  uint8_t tiers = 0;
  if (!r.U32(&h.k) || !r.U8(&tiers)) {
    return internal::PayloadError(kHqName, "truncated header (", in.payload.size(), " bytes)");
  }
  if (tiers < 1 || tiers > kHqMaxTiers) {
    return internal::PayloadError(kHqName, int{tiers}, " tiers, not 1 to ", kHqMaxTiers);
  }
  if (h.k > in.numel) {
    return internal::PayloadError(kHqName, "k = ", h.k, " exceeds numel = ", in.numel);
  }
  for (int j = 0; j < tiers; ++j) {
    uint8_t b = 0;
    if (!r.U8(&b)) return internal::PayloadError(kHqName, "truncated header (tier bits)");
    if (b < kHqMinBits || b > kHqMaxBits) {
      return internal::PayloadError(kHqName, "tier ", j, " has ", int{b}, " bits, not ", kHqMinBits,
                                    " to ", kHqMaxBits);
    }
    h.bits.push_back(b);
  }
  if (!r.U8(&h.rice)) return internal::PayloadError(kHqName, "truncated header (rice)");
  if (h.rice == kHqEveryPosition) {
    if (h.k != in.numel) {
      return internal::PayloadError(kHqName, "every position sent but k = ", h.k,
                                    " of numel = ", in.numel);
    }
  } else if (h.rice > 31) {
    return internal::PayloadError(kHqName, "Rice parameter ", int{h.rice}, " > 31");
  }
  TERN_RETURN_IF_ERROR(internal::CheckScales(kHqName, in, 2 * size_t{tiers}));
  for (int j = 0; j < tiers; ++j) {
    if (!(in.scales[2 * j] <= in.scales[2 * j + 1])) {
      return internal::PayloadError(kHqName, "tier ", j, "'s grid [", in.scales[2 * j], ", ",
                                    in.scales[2 * j + 1], "] is empty");
    }
  }
  // Each element takes at least its tier, sign and code bits: a payload too short for k of them
  // is refused before any is read.
  int least = 64;
  for (int b : h.bits) least = std::min(least, b);
  const uint64_t min_bits = uint64_t{h.k} * static_cast<uint64_t>(HqTierBits(tiers) + least);
  if (r.remaining() * 8 < min_bits) {
    return internal::PayloadError(kHqName, "k = ", h.k, " needs at least ", (min_bits + 7) / 8,
                                  " stream bytes, got ", r.remaining());
  }
  h.stream = r.ptr();
  h.stream_bytes = r.remaining();
  return h;
}

}  // namespace tern::format
