#include "kernels/format/chunk_topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/status_macros.h"
#include "kernels/format/payload.h"

namespace tern::format {

std::string ChunkTopKParams::Canonical() const {
  return absl::StrCat("chunk=", chunk, ",k=", k, ",bits=", bits);
}
std::string ChunkTopKParams::Spec() const { return absl::StrCat("chunk-topk:", Canonical()); }

size_t ChunkTopKParams::Kept(size_t n) const {
  const size_t full = n / chunk;
  return full * k + std::min<size_t>(k, n - full * chunk);
}

absl::StatusOr<ChunkTopKParams> ParseChunkTopKParams(SpecParams& p) {
  ChunkTopKParams o;
  TERN_ASSIGN_OR_RETURN(int64_t chunk, p.Int("chunk", 4096, 1, kMaxTopKChunk));
  TERN_ASSIGN_OR_RETURN(double ratio, p.Double("ratio", 0, 0, 1));
  TERN_ASSIGN_OR_RETURN(int64_t k, p.Int("k", 0, 0, kMaxTopKChunk));
  TERN_ASSIGN_OR_RETURN(int64_t bits, p.Int("bits", 2, 1, 8));
  if (ratio > 0 && k > 0) {
    return absl::InvalidArgumentError("chunk-topk: give k or ratio, not both");
  }
  if (ratio > 0) k = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(chunk)));
  if (k == 0) k = std::min<int64_t>(64, chunk);
  if (k > chunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk-topk: k=", k, " is more than chunk=", chunk));
  }
  o.chunk = static_cast<uint32_t>(chunk);
  o.k = static_cast<uint32_t>(k);
  o.bits = static_cast<uint32_t>(bits);
  return o;
}

void WriteChunkTopKHeader(const ChunkTopKParams& p, uint8_t* out) {
  std::memcpy(out, &p.chunk, 4);
  std::memcpy(out + 4, &p.k, 4);
  out[8] = static_cast<uint8_t>(p.bits);
}

absl::StatusOr<ChunkTopKHeader> ReadChunkTopKHeader(const EncodedView& in) {
  ByteReader r(in.payload.data(), in.payload.size());
  ChunkTopKHeader h;
  uint8_t bits;
  if (!r.U32(&h.params.chunk) || !r.U32(&h.params.k) || !r.U8(&bits)) {
    return internal::PayloadError(kChunkTopKName, "truncated header");
  }
  h.params.bits = bits;
  const ChunkTopKParams& p = h.params;
  if (p.chunk == 0 || p.chunk > kMaxTopKChunk || p.k == 0 || p.k > p.chunk || p.bits == 0 ||
      p.bits > 8) {
    return internal::PayloadError(kChunkTopKName, "chunk ", p.chunk, ", k ", p.k, ", bits ", p.bits,
                                  ": need 1 <= k <= chunk <= 65536 and 1 <= bits <= 8");
  }
  h.chunks = p.Chunks(in.numel);
  h.kept = p.Kept(in.numel);
  const size_t code_bytes = (h.kept * p.bits + 7) / 8;
  if (r.remaining() != 2 * h.kept + code_bytes) {
    return internal::PayloadError(kChunkTopKName, "expected ", 2 * h.kept + code_bytes,
                                  " bytes of indices and codes, got ", r.remaining());
  }
  h.indices = r.ptr();
  h.codes = h.indices + 2 * h.kept;
  TERN_RETURN_IF_ERROR(internal::CheckScales(kChunkTopKName, in, h.chunks * p.levels()));
  size_t at = 0;
  for (size_t c = 0; c < h.chunks; ++c) {
    const size_t len = std::min<size_t>(p.chunk, in.numel - c * p.chunk);
    const size_t kc = std::min<size_t>(p.k, len);
    int64_t last = -1;
    for (size_t j = 0; j < kc; ++j, ++at) {
      uint16_t idx;
      std::memcpy(&idx, h.indices + 2 * at, 2);
      if (idx <= last || idx >= len) {
        return internal::PayloadError(kChunkTopKName, "chunk ", c, ": index ", idx,
                                      " out of order or past the chunk's ", len, " values");
      }
      last = idx;
    }
  }
  if (!internal::PaddingIsZero(h.codes, code_bytes, h.kept * p.bits)) {
    return internal::PayloadError(kChunkTopKName, "non-zero padding bits");
  }
  return h;
}

}  // namespace tern::format
