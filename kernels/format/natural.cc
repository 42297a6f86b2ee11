#include "kernels/format/natural.h"

#include "kernels/format/payload.h"

namespace tern::format {

absl::StatusOr<NaturalHeader> ReadNaturalHeader(const EncodedView& in) {
  if (!in.scales.empty()) return internal::PayloadError(kNaturalName, "expected no scales");
  NaturalHeader h;
  h.sign_bytes = (in.numel + 7) / 8;
  if (in.payload.size() != in.numel + h.sign_bytes) {
    return internal::PayloadError(kNaturalName, "expected ", in.numel + h.sign_bytes,
                                  " bytes, got ", in.payload.size());
  }
  h.codes = in.payload.data();
  h.signs = h.codes + in.numel;
  if (!internal::PaddingIsZero(h.signs, h.sign_bytes, in.numel)) {
    return internal::PayloadError(kNaturalName, "non-zero padding bits");
  }
  return h;
}

}  // namespace tern::format
