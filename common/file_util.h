// Files written so that a reader never sees half of one: write a temporary beside the target,
// fsync, rename over it (what a checkpoint or a saved model needs).
//
// Thread-safety: a function of its arguments; two writers of one path race on the rename.
#ifndef TERN_COMMON_FILE_UTIL_H_
#define TERN_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"

namespace tern {

// Writes `bytes` to `path` atomically: "<path>.tmp", fsync, rename. UNAVAILABLE with the errno
// text on failure.
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes);

// Creates directory `path` (mode 0755) unless it exists. UNAVAILABLE with the errno text.
absl::Status MakeDirectory(const std::string& path);

}  // namespace tern

#endif  // TERN_COMMON_FILE_UTIL_H_
