#include "common/crc32.h"

#include <isa-l/crc.h>
#include <zlib.h>

#include <algorithm>

namespace tern {

uint32_t Crc32(const void* data, size_t n, uint32_t crc) {
  // ISA-L's gzip CRC is zlib's crc32() (same polynomial, reflection and conditioning) folded
  // with PCLMULQDQ: ~3x zlib's speed on 1 MiB chunks, which the receive path checks in full.
  auto p = static_cast<const unsigned char*>(data);
  uint32_t c = crc;
  while (n > 0) {  // ISA-L takes uint64_t lengths, but keep steps bounded like zlib's uInt
    const size_t step = std::min<size_t>(n, size_t{1} << 30);
    c = crc32_gzip_refl(c, p, step);
    p += step;
    n -= step;
  }
  return c;
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, size_t len_b) {
  return static_cast<uint32_t>(crc32_combine(crc_a, crc_b, static_cast<z_off_t>(len_b)));
}

}  // namespace tern
