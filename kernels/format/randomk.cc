#include "kernels/format/randomk.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/status_macros.h"
#include "kernels/format/payload.h"

namespace tern::format {

std::string RandomKParams::Canonical() const {
  return absl::StrCat("ratio=", ratio, ",unbiased=", unbiased ? 1 : 0);
}
std::string RandomKParams::Spec() const { return absl::StrCat("randomk:", Canonical()); }

absl::StatusOr<RandomKParams> ParseRandomKParams(SpecParams& p) {
  RandomKParams o;
  TERN_ASSIGN_OR_RETURN(o.ratio, p.Double("ratio", 0.01, 1e-9, 1.0));
  TERN_ASSIGN_OR_RETURN(o.unbiased, p.Bool("unbiased", false));
  return o;
}

void WriteRandomKHeader(uint64_t seed, uint32_t k, uint8_t* out) {
  std::memcpy(out, &seed, 8);
  std::memcpy(out + 8, &k, 4);
}

absl::StatusOr<RandomKHeader> ReadRandomKHeader(const EncodedView& in) {
  if (!in.scales.empty()) return internal::PayloadError(kRandomKName, "expected no scales");
  ByteReader r(in.payload.data(), in.payload.size());
  RandomKHeader h;
  if (!r.U64(&h.seed) || !r.U32(&h.k)) {
    return internal::PayloadError(kRandomKName, "truncated header");
  }
  if (h.k > in.numel) {
    return internal::PayloadError(kRandomKName, "k = ", h.k, " exceeds ", in.numel);
  }
  if (r.remaining() != 4 * uint64_t{h.k}) {
    return internal::PayloadError(kRandomKName, "k = ", h.k, " needs ", 4 * uint64_t{h.k},
                                  " value bytes, got ", r.remaining());
  }
  h.values = r.ptr();
  return h;
}

}  // namespace tern::format
