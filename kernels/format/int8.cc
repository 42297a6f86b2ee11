#include "kernels/format/int8.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/status_macros.h"
#include "kernels/format/payload.h"

namespace tern::format {

std::string Int8Params::Canonical() const {
  return absl::StrCat("block=", block, ",mode=", minmax ? "minmax" : "absmax",
                      ",round=", stochastic ? "stochastic" : "nearest");
}
std::string Int8Params::Spec() const { return absl::StrCat("int8:", Canonical()); }

absl::StatusOr<Int8Params> ParseInt8Params(SpecParams& p) {
  Int8Params o;
  TERN_ASSIGN_OR_RETURN(int64_t block, p.Int("block", 1024, 1, 1 << 20));
  TERN_ASSIGN_OR_RETURN(std::string mode, p.Enum("mode", "absmax", {"absmax", "minmax"}));
  TERN_ASSIGN_OR_RETURN(std::string round, p.Enum("round", "nearest", {"nearest", "stochastic"}));
  o.block = static_cast<uint32_t>(block);
  o.minmax = mode == "minmax";
  o.stochastic = round == "stochastic";
  return o;
}

void WriteInt8Header(const Int8Params& p, uint8_t* out) {
  std::memcpy(out, &p.block, 4);
  out[4] = p.minmax ? kInt8MinMax : kInt8AbsMax;
}

absl::StatusOr<Int8Header> ReadInt8Header(const EncodedView& in) {
  ByteReader r(in.payload.data(), in.payload.size());
  uint32_t block;
  uint8_t mode;
  if (!r.U32(&block) || !r.U8(&mode)) return internal::PayloadError(kInt8Name, "truncated header");
  if (block == 0 || block > (1u << 20)) {
    return internal::PayloadError(kInt8Name, "block size ", block, " outside [1, 2^20]");
  }
  if (mode != kInt8AbsMax && mode != kInt8MinMax) {
    return internal::PayloadError(kInt8Name, "unknown mode ", int{mode});
  }
  if (r.remaining() != in.numel) {
    return internal::PayloadError(kInt8Name, "expected ", in.numel, " value bytes, got ",
                                  r.remaining());
  }
  Int8Header h;
  h.block = block;
  h.minmax = mode == kInt8MinMax;
  h.blocks = (in.numel + block - 1) / block;
  h.codes = r.ptr();
  TERN_RETURN_IF_ERROR(
      internal::CheckScales(kInt8Name, in, h.minmax ? 2 * h.blocks : h.blocks, h.minmax));
  return h;
}

}  // namespace tern::format
