// tern.v1.BundleChunk messages without protobuf's copies of their data, for the streams that
// carry large tensors (Gossip.Push): a receiver reads a chunk's header fields from the bytes gRPC
// received and leaves its data in gRPC's slices, where the bundle parser reads it; a sender hands
// gRPC a small header and a slice over the chunk's data, which gRPC writes from in place.
//
// Thread-safety: free functions; a RawChunk is not shared.
#ifndef TERN_CORE_RPC_RAW_CHUNK_H_
#define TERN_CORE_RPC_RAW_CHUNK_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chunking.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// A received chunk: its header and its data as views into the message's slices, which `owner`
// keeps (a bundle's payload left in place holds it on).
struct RawChunk {
  ChunkHeader header;
  std::shared_ptr<const void> owner;
  std::vector<absl::string_view> data;  // in order; empty pieces left out
  size_t data_size = 0;
  size_t message_size = 0;  // the serialized chunk's bytes
};

// Reads a serialized BundleChunk from `message` as protobuf would (fields in any order, unknown
// fields skipped, the last of a repeated scalar or of `data` wins), refusing bytes protobuf
// refuses: InvalidArgument, never a crash.
absl::StatusOr<RawChunk> ParseRawChunk(const grpc::ByteBuffer& message);
// The same over pieces of bytes (`owner`, if any, is kept in the result's slices' place).
absl::StatusOr<RawChunk> ParseRawChunkPieces(std::vector<absl::string_view> pieces);

// The fields a striped push (docs/wire-format.md) sets on every chunk it sends.
struct ChunkStripe {
  uint64_t stream_id = 0;
  uint32_t stripes = 0;
};

// `chunk` as the message it serializes to, with its data as a slice over chunk.data() that keeps
// `owner` (which must keep `chunk` alive and unchanged) until gRPC has written it; with `stripe`,
// its stream_id and stripes fields are written from there instead.
grpc::ByteBuffer RawChunkMessage(const v1::BundleChunk& chunk, std::shared_ptr<const void> owner,
                                 const ChunkStripe* stripe = nullptr);

}  // namespace tern

#endif  // TERN_CORE_RPC_RAW_CHUNK_H_
