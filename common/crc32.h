// CRC-32 (the zlib / IEEE 802.3 polynomial) used for chunk integrity checks.
#ifndef TERN_COMMON_CRC32_H_
#define TERN_COMMON_CRC32_H_

#include <cstddef>
#include <cstdint>

namespace tern {

// CRC of [data, data + n), continuing from `crc` (0 to start).
uint32_t Crc32(const void* data, size_t n, uint32_t crc = 0);
// The CRC-32 of A followed by B from crc(A), crc(B) and B's length, without reading any byte.
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, size_t len_b);

}  // namespace tern

#endif  // TERN_COMMON_CRC32_H_
