#include "common/crc32.h"

#include <zlib.h>

#include <algorithm>

namespace tern {

uint32_t Crc32(const void* data, size_t n, uint32_t crc) {
  auto p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {  // zlib takes uInt lengths
    const size_t step = std::min<size_t>(n, 1u << 30);
    c = crc32(c, p, static_cast<uInt>(step));
    p += step;
    n -= step;
  }
  return static_cast<uint32_t>(c);
}

}  // namespace tern
