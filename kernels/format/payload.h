// The checks every decoder of untrusted payloads shares, on the CPU and the GPU side alike: the
// payload's codec name and element count (kernels/view_check.h), the scale count and values, and
// the error every malformed payload gets. Internal to kernels/.
//
// Thread-safety: pure functions.
#ifndef TERN_KERNELS_FORMAT_PAYLOAD_H_
#define TERN_KERNELS_FORMAT_PAYLOAD_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/codec.h"
#include "kernels/view_check.h"

namespace tern::internal {

template <typename... Args>
absl::Status PayloadError(absl::string_view codec, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(codec, " payload: ", args...));
}

// Checks that there are exactly `count` scales and each is finite and >= 0 (or any sign when
// `signed_ok`).
absl::Status CheckScales(absl::string_view codec, const EncodedView& in, size_t count,
                         bool signed_ok = false);

// Checks that `n` little-endian fp32 words at `p` are finite and at most `bound` in magnitude
// (what a payload of raw values must hold before a decoder writes any of them).
absl::Status CheckF32Values(absl::string_view codec, const uint8_t* p, size_t n,
                            float bound = 3.4028235e38f);

// Checks that the padding bits of a bit-packed field's last byte are zero: `bits_used` bits of
// `bytes` bytes at `p` carry values (a canonical payload has one encoding).
bool PaddingIsZero(const uint8_t* p, size_t bytes, size_t bits_used);

}  // namespace tern::internal

#endif  // TERN_KERNELS_FORMAT_PAYLOAD_H_
