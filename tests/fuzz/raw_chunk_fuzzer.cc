// libFuzzer target for the raw BundleChunk reader (core/rpc/raw_chunk.h): the input's first byte
// picks the piece size, the rest is a serialized BundleChunk (or anything). It must end in a chunk
// or an error status, accept exactly what protobuf accepts, and read what protobuf reads (else it
// aborts: a difference is a bug).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/rpc/raw_chunk.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<absl::string_view> pieces;
  for (size_t at = 0; at < bytes.size(); at += piece) pieces.push_back(bytes.substr(at, piece));
  absl::StatusOr<tern::RawChunk> got = tern::ParseRawChunkPieces(pieces);
  tern::v1::BundleChunk want;
  const bool ok = want.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  if (got.ok() != ok) {
    // Groups are the one thing protobuf takes (as unknown fields) and the raw reader refuses.
    if (ok && absl::StrContains(got.status().message(), "wire type 3")) return 0;
    std::abort();
  }
  if (!ok) return 0;
  std::string joined;
  for (absl::string_view p : got->data) joined.append(p.data(), p.size());
  const tern::ChunkHeader& h = got->header;
  if (h.stream_id != want.stream_id() || h.offset != want.offset() ||
      h.total_size != want.total_size() || h.data_crc32 != want.data_crc32() ||
      h.last != want.last() || h.bundle_crc32 != want.bundle_crc32() || joined != want.data()) {
    std::abort();
  }
  return 0;
}
