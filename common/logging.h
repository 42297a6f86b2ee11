// Process-wide logging setup (spdlog). Libraries log through spdlog's default logger; only the
// executable's main() calls InitLogging.
#ifndef TERN_COMMON_LOGGING_H_
#define TERN_COMMON_LOGGING_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tern {

// Sets the level ("trace", "debug", "info", "warn", "error", "off") and tern's line format.
absl::Status InitLogging(absl::string_view level);

}  // namespace tern

#endif  // TERN_COMMON_LOGGING_H_
