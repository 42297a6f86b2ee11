// The error convention of tern's C interfaces (clients/c/tern_c.h,
// clients/embedded/tern_embedded.h): a function returns 0 on success, else the absl::StatusCode,
// and writes the status's message, NUL-terminated and cut to fit, into the caller's buffer.
//
// Thread-safety: a free function over the caller's buffer.
#ifndef TERN_COMMON_C_ERROR_H_
#define TERN_COMMON_C_ERROR_H_

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/status/status.h"

namespace tern {

// `s`'s code (kUnknown for an OK status, which is not a failure to report), with its message in
// error[0, error_size) when error is not null.
inline int CErrorCode(const absl::Status& s, char* error, size_t error_size) {
  if (error != nullptr && error_size > 0) {
    const absl::string_view m = s.message();
    const size_t n = std::min(m.size(), error_size - 1);
    std::memcpy(error, m.data(), n);
    error[n] = '\0';
  }
  return s.ok() ? static_cast<int>(absl::StatusCode::kUnknown) : static_cast<int>(s.code());
}

}  // namespace tern

#endif  // TERN_COMMON_C_ERROR_H_
