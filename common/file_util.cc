#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tern {

absl::Status MakeDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot sync ", tmp, ": ", std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace tern
