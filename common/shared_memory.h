// A POSIX shared-memory segment (shm_open, mode 0600) this process created and maps read-write,
// for another process on the same host to map by its path. Unmapped and unlinked on destruction.
//
// Thread-safety: the object is immutable once made; its bytes are shared with other processes,
// and who writes them when is up to the protocol that uses it.
#ifndef TERN_COMMON_SHARED_MEMORY_H_
#define TERN_COMMON_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tern {

class SharedSegment {
 public:
  // `name` starts with '/' and has no other '/': "/tern-w0-42". Fails if it exists.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Create(const std::string& name,
                                                               size_t size);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // Where another process opens it (Linux mounts POSIX shm at /dev/shm).
  std::string path() const { return "/dev/shm" + name_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  SharedSegment(std::string name, uint8_t* data, size_t size)
      : name_(std::move(name)), data_(data), size_(size) {}
  const std::string name_;
  uint8_t* const data_;
  const size_t size_;
};

}  // namespace tern

#endif  // TERN_COMMON_SHARED_MEMORY_H_
