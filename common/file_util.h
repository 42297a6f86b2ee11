// Files written so that a reader never sees half of one: write a temporary beside the target,
// fsync, rename over it (what a checkpoint or a saved model needs); files read whole.
//
// Thread-safety: a function of its arguments; two writers of one path race on the rename.
#ifndef TERN_COMMON_FILE_UTIL_H_
#define TERN_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tern {

// Writes `bytes` to `path` atomically and durably: "<path>.tmp.<pid>", fsync, rename, fsync of
// the directory (so the rename survives a crash). Processes writing the same path at once (every
// rank of a launcher given the same command) each replace it whole; the last one stays.
// UNAVAILABLE with the errno text on failure.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes);

// The whole of file `path`; NOT_FOUND when there is none, UNAVAILABLE when it cannot be read.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Creates directory `path` (mode 0755) unless it exists. UNAVAILABLE with the errno text.
absl::Status MakeDirectory(const std::string& path);

// UNAVAILABLE "<what> <path>: <strerror(errno)>": a failed system call on a file, read from errno
// at the call.
absl::Status ErrnoError(absl::string_view what, const std::string& path);

// Whether something (a file, a directory, ...) is at `path`; whether it is a directory.
bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);

// The directory holding `path`, with its trailing '/' ("dir/" for "dir/f", "/" for "/f"), or "."
// when `path` names none.
std::string DirectoryOf(const std::string& path);

}  // namespace tern

#endif  // TERN_COMMON_FILE_UTIL_H_
