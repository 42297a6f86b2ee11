#include "kernels/format/sign.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/status_macros.h"
#include "kernels/format/payload.h"

namespace tern::format {

std::string SignParams::Canonical() const { return absl::StrCat("chunk=", chunk); }
std::string SignParams::Spec() const { return absl::StrCat("sign:", Canonical()); }

absl::StatusOr<SignParams> ParseSignParams(SpecParams& p) {
  TERN_ASSIGN_OR_RETURN(int64_t chunk, p.Int("chunk", 1024, 8, 1 << 30));
  if (chunk % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sign: chunk=", chunk, " must be a multiple of 8"));
  }
  SignParams o;
  o.chunk = static_cast<uint32_t>(chunk);
  return o;
}

void WriteSignHeader(const SignParams& p, uint8_t* out) { std::memcpy(out, &p.chunk, 4); }

absl::StatusOr<SignHeader> ReadSignHeader(const EncodedView& in) {
  ByteReader r(in.payload.data(), in.payload.size());
  uint32_t chunk;
  if (!r.U32(&chunk)) return internal::PayloadError(kSignName, "truncated header");
  if (chunk < 8 || chunk % 8 != 0 || chunk > (1u << 30)) {
    return internal::PayloadError(kSignName, "chunk ", chunk,
                                  " is not a multiple of 8 in [8, 2^30]");
  }
  const size_t bytes = (in.numel + 7) / 8;
  if (r.remaining() != bytes) {
    return internal::PayloadError(kSignName, "expected ", bytes, " sign bytes, got ",
                                  r.remaining());
  }
  SignHeader h;
  h.chunk = chunk;
  h.chunks = (in.numel + chunk - 1) / chunk;
  h.bits = r.ptr();
  TERN_RETURN_IF_ERROR(internal::CheckScales(kSignName, in, h.chunks));
  if (!internal::PaddingIsZero(h.bits, bytes, in.numel)) {
    return internal::PayloadError(kSignName, "non-zero padding bits");
  }
  return h;
}

}  // namespace tern::format
