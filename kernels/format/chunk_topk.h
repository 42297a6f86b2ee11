// chunk-topk.v1's wire format (docs/wire-format.md §chunk-topk.v1): SparseLoCo's compressor, the
// k largest |x| of every chunk with their values in `bits` bits (a sign and bits − 1 bits of
// magnitude level). Payload: u32 chunk | u32 k | u8 bits | per chunk min(k, its length) u16
// indices, ascending, local to the chunk | the codes, bits each, LSB first, zero padding; scales:
// per chunk 2^(bits−1) magnitude levels, finite, >= 0, ascending.
#ifndef TERN_KERNELS_FORMAT_CHUNK_TOPK_H_
#define TERN_KERNELS_FORMAT_CHUNK_TOPK_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern::format {

inline constexpr char kChunkTopKName[] = "chunk-topk.v1";
inline constexpr size_t kChunkTopKHeaderBytes = 9;
inline constexpr uint32_t kMaxTopKChunk = 65536;  // local indices are u16

struct ChunkTopKParams {
  uint32_t chunk = 4096;          // [1, 65536]
  uint32_t k = 64;                // kept a chunk, [1, chunk]
  uint32_t bits = 2;              // a value's code: [1, 8]
  std::string Canonical() const;  // "chunk=4096,k=64,bits=2"
  std::string Spec() const;
  uint32_t levels() const { return 1u << (bits - 1); }
  size_t Chunks(size_t n) const { return (n + chunk - 1) / chunk; }
  // Values kept of n: min(k, length) per chunk.
  size_t Kept(size_t n) const;
};
// chunk (4096), then k (64) or ratio (k = ceil(ratio · chunk)), bits (2).
absl::StatusOr<ChunkTopKParams> ParseChunkTopKParams(SpecParams& p);

void WriteChunkTopKHeader(const ChunkTopKParams& p, uint8_t* out);  // kChunkTopKHeaderBytes

struct ChunkTopKHeader {
  ChunkTopKParams params;
  size_t chunks = 0;
  size_t kept = 0;
  const uint8_t* indices = nullptr;  // kept x u16, checked: ascending within each chunk, in range
  const uint8_t* codes = nullptr;    // ceil(kept · bits / 8) bytes, padding checked
};
// The whole payload: header, sizes, scales, indices, padding.
absl::StatusOr<ChunkTopKHeader> ReadChunkTopKHeader(const EncodedView& in);

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_CHUNK_TOPK_H_
