#include "common/allocator.h"

#include <malloc.h>

namespace tern {

void KeepFreedMemoryForReuse() {
  // Setting either disables glibc's adaptive thresholds.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

}  // namespace tern
