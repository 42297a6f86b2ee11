#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tern {

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Create(const std::string& name,
                                                                     size_t size) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory name '", name, "'"));
  }
  if (size == 0) return absl::InvalidArgumentError("an empty shared memory segment");
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("shm_open ", name, ": ", std::strerror(errno)));
  }
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(size)) == 0) {
    p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("shared memory ", name, " of ", size, " bytes: ", std::strerror(err)));
  }
  return std::unique_ptr<SharedSegment>(new SharedSegment(name, static_cast<uint8_t*>(p), size));
}

SharedSegment::~SharedSegment() {
  munmap(data_, size_);
  shm_unlink(name_.c_str());
}

}  // namespace tern
