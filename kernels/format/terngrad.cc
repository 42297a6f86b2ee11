#include "kernels/format/terngrad.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/format/payload.h"

namespace tern::format {

std::string TernGradParams::Canonical() const {
  return absl::StrCat("clip=", clip, ",pack=", pack == kTernGrad2Bit ? "2bit" : "base3");
}
std::string TernGradParams::Spec() const { return absl::StrCat("terngrad:", Canonical()); }

absl::StatusOr<TernGradParams> ParseTernGradParams(SpecParams& p) {
  TernGradParams o;
  TERN_ASSIGN_OR_RETURN(o.clip, p.Double("clip", 2.5, 0.0, 1e6));
  // (A StatusOr, not TERN_ASSIGN_OR_RETURN: GCC 12 warns that the moved string may be read
  // uninitialized in the comparison.)
  absl::StatusOr<std::string> pack = p.Enum("pack", "2bit", {"2bit", "base3"});
  if (!pack.ok()) return pack.status();
  o.pack = *pack == "2bit" ? kTernGrad2Bit : kTernGradBase3;
  return o;
}

absl::StatusOr<TernGradHeader> ReadTernGradHeader(const EncodedView& in) {
  if (in.payload.empty()) return internal::PayloadError(kTernGradName, "truncated header");
  TernGradHeader h;
  h.pack = in.payload[0];
  if (h.pack != kTernGrad2Bit && h.pack != kTernGradBase3) {
    return internal::PayloadError(kTernGradName, "unknown packing ", int{h.pack});
  }
  h.bytes = TernGradPackedBytes(h.pack, in.numel);
  if (in.payload.size() != 1 + h.bytes) {
    return internal::PayloadError(kTernGradName, "expected ", 1 + h.bytes, " bytes, got ",
                                  in.payload.size());
  }
  TERN_RETURN_IF_ERROR(internal::CheckScales(kTernGradName, in, 1));
  h.body = in.payload.data() + 1;
  if (h.bytes > 0) {  // canonical (zero) padding in the last byte
    const uint8_t last = h.body[h.bytes - 1];
    bool padded_ok = true;
    if (h.pack == kTernGrad2Bit && in.numel % 4 != 0) {
      padded_ok = (last >> (2 * (in.numel % 4))) == 0;
    } else if (h.pack == kTernGradBase3 && in.numel % 5 != 0) {
      unsigned pow = 1;
      for (size_t j = 0; j < in.numel % 5; ++j) pow *= 3;
      padded_ok = last < pow;
    }
    if (!padded_ok) {
      return internal::PayloadError(kTernGradName, "non-zero padding in the last byte");
    }
  }
  return h;
}

}  // namespace tern::format
