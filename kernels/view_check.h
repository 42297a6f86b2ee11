// The first check of every decoder, CPU and GPU alike (Codec::Decode makes it before a codec's
// own): the payload is the decoder's codec's and holds as many elements as the output, within the
// limit every codec keeps. Below format/ (which builds its payload checks on it) and the codecs.
//
// Thread-safety: pure functions.
#ifndef TERN_KERNELS_VIEW_CHECK_H_
#define TERN_KERNELS_VIEW_CHECK_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/codec.h"

namespace tern::internal {

// Largest element count any codec accepts (2^32 - 1): indices travel as u32.
inline constexpr uint64_t kMaxNumel = 0xffffffffULL;

inline absl::Status CheckNumel(absl::string_view codec, size_t n) {
  if (n > kMaxNumel) {
    return absl::InvalidArgumentError(
        absl::StrCat(codec, ": tensor of ", n, " elements exceeds the limit of ", kMaxNumel));
  }
  return absl::OkStatus();
}

// The payload is `codec`'s and holds `out_size` elements (what every Decode checks first).
absl::Status CheckView(absl::string_view codec, const EncodedView& in, size_t out_size);

}  // namespace tern::internal

#endif  // TERN_KERNELS_VIEW_CHECK_H_
