#include "kernels/format/cast.h"

#include "kernels/format/payload.h"

namespace tern::format {

absl::Status CheckCastPayload(const CastFormat& f, const EncodedView& in) {
  if (!in.scales.empty()) return internal::PayloadError(f.name, "expected no scales");
  if (in.payload.size() != in.numel * f.word_bytes) {
    return internal::PayloadError(f.name, "expected ", in.numel * f.word_bytes, " bytes for ",
                                  in.numel, " elements, got ", in.payload.size());
  }
  return absl::OkStatus();
}

}  // namespace tern::format
