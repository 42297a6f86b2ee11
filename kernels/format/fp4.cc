#include "kernels/format/fp4.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/status_macros.h"
#include "kernels/format/payload.h"

namespace tern::format {

const Fp4Table& Fp4Magnitudes(uint8_t element) {
  static constexpr Fp4Table kE3M0 = {0.0f, 0.015625f, 0.03125f, 0.0625f, 0.125f, 0.25f, 0.5f, 1.0f};
  static constexpr Fp4Table kE2M1 = {0.0f,        0.5f / 6.0f, 1.0f / 6.0f, 1.5f / 6.0f,
                                     2.0f / 6.0f, 3.0f / 6.0f, 4.0f / 6.0f, 1.0f};
  return element == kFp4E2M1 ? kE2M1 : kE3M0;
}

std::string Fp4Params::Canonical() const {
  return absl::StrCat("block=", block, ",element=", element == kFp4E2M1 ? "e2m1" : "e3m0",
                      ",round=", stochastic ? "stochastic" : "nearest");
}
std::string Fp4Params::Spec() const { return absl::StrCat("fp4:", Canonical()); }

absl::StatusOr<Fp4Params> ParseFp4Params(SpecParams& p) {
  Fp4Params o;
  TERN_ASSIGN_OR_RETURN(int64_t block, p.Int("block", 128, 1, int64_t{1} << 30));
  TERN_ASSIGN_OR_RETURN(std::string element, p.Enum("element", "e3m0", {"e3m0", "e2m1"}));
  TERN_ASSIGN_OR_RETURN(std::string round, p.Enum("round", "nearest", {"nearest", "stochastic"}));
  o.block = static_cast<uint32_t>(block);
  o.element = element == "e2m1" ? kFp4E2M1 : kFp4E3M0;
  o.stochastic = round == "stochastic";
  return o;
}

void WriteFp4Header(const Fp4Params& p, uint8_t* out) {
  std::memcpy(out, &p.block, 4);
  out[4] = p.element;
}

absl::StatusOr<Fp4Header> ReadFp4Header(const EncodedView& in) {
  ByteReader r(in.payload.data(), in.payload.size());
  uint32_t block;
  uint8_t element;
  if (!r.U32(&block) || !r.U8(&element))
    return internal::PayloadError(kFp4Name, "truncated header");
  if (block == 0 || block > (1u << 30)) {
    return internal::PayloadError(kFp4Name, "block size ", block, " outside [1, 2^30]");
  }
  if (element != kFp4E3M0 && element != kFp4E2M1) {
    return internal::PayloadError(kFp4Name, "unknown element format ", int{element});
  }
  const size_t bytes = (in.numel + 1) / 2;
  if (r.remaining() != bytes) {
    return internal::PayloadError(kFp4Name, "expected ", bytes, " code bytes, got ", r.remaining());
  }
  Fp4Header h;
  h.block = block;
  h.element = element;
  h.blocks = (in.numel + block - 1) / block;
  h.codes = r.ptr();
  TERN_RETURN_IF_ERROR(internal::CheckScales(kFp4Name, in, h.blocks));
  for (size_t i = 0; i < bytes; ++i) {
    const uint8_t b = h.codes[i];
    if ((b & 0x0f) == 0x08 || (b & 0xf0) == 0x80) {
      return internal::PayloadError(kFp4Name, "negative zero code in byte ", i);
    }
  }
  if (in.numel % 2 == 1 && (h.codes[bytes - 1] & 0xf0) != 0) {
    return internal::PayloadError(kFp4Name, "non-zero padding nibble");
  }
  return h;
}

}  // namespace tern::format
