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

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, size_t len_b) {
  return static_cast<uint32_t>(crc32_combine(crc_a, crc_b, static_cast<z_off_t>(len_b)));
}

}  // namespace tern
