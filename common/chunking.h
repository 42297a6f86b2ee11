// Streams a TensorBundle of any size as BundleChunk messages of at most 1 MiB, and reassembles
// them with integrity checks. The assembler treats chunks as untrusted: a gap, overlap, size
// change, oversize bundle, CRC mismatch or unparsable result is an InvalidArgument/DataLoss error,
// never a crash, and it never allocates more than its configured maximum.
//
// Thread-safety: BundleAssembler is not thread-safe (one per incoming stream).
#ifndef TERN_COMMON_CHUNKING_H_
#define TERN_COMMON_CHUNKING_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/bundle_stream.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// Largest `data` a chunk may carry.
inline constexpr size_t kMaxChunkBytes = size_t{1} << 20;

// Serializes `bundle` into chunks of at most `max_chunk_bytes` (1..kMaxChunkBytes).
absl::StatusOr<std::vector<v1::BundleChunk>> ChunkBundle(const v1::TensorBundle& bundle,
                                                         uint64_t stream_id,
                                                         size_t max_chunk_bytes = kMaxChunkBytes);

// A BundleChunk's fields but its data (which a raw receiver keeps where it arrived).
struct ChunkHeader {
  uint64_t stream_id = 0;
  uint64_t offset = 0;
  uint64_t total_size = 0;
  uint32_t data_crc32 = 0;
  bool last = false;
  uint32_t bundle_crc32 = 0;
  uint32_t stripes = 0;  // streams one push is spread over (0, 1: one); Gossip.Push only
};

class BundleAssembler {
 public:
  // Bundles larger than `max_bundle_bytes` are refused at their first chunk. `observer` (may be
  // null) sees the payloads' bytes as they arrive and must outlive the assembler.
  explicit BundleAssembler(uint64_t max_bundle_bytes, PayloadObserver* observer = nullptr)
      : max_bundle_bytes_(max_bundle_bytes), observer_(observer) {}

  // Accepts the next chunk: checks it, then parses its bytes into the bundle under way (a
  // tensor's payload bytes are copied once, into place, as each chunk comes). After an error the
  // assembler is poisoned: further calls fail.
  absl::Status Add(const v1::BundleChunk& chunk);
  // The same for a chunk whose data is in pieces (in order), read in place. With an `owner` that
  // keeps the pieces valid, large payloads read in pieces stay there (BundleStreamParser::Feed).
  absl::Status Add(const ChunkHeader& header, absl::Span<const absl::string_view> data,
                   const std::shared_ptr<const void>& owner = nullptr);
  // True once the chunk marked `last` was accepted.
  bool complete() const { return complete_; }
  // The bundle. REQUIRES: complete().
  absl::StatusOr<v1::TensorBundle> Finish();
  // The bundle with the payloads kept in place left there. REQUIRES: complete().
  absl::StatusOr<ReceivedBundle> FinishInPlace();

 private:
  absl::Status Fail(absl::Status s) {
    failed_ = true;
    parser_.reset();
    return s;
  }
  // Everything about the chunk but its CRC.
  absl::Status Check(const ChunkHeader& chunk, absl::Span<const absl::string_view> data,
                     size_t size);
  // Feeds the chunk's data to the parser and checks its CRC on the way.
  absl::Status CheckedFeed(const ChunkHeader& chunk, absl::Span<const absl::string_view> data,
                           const std::shared_ptr<const void>& owner);

  uint64_t max_bundle_bytes_;
  PayloadObserver* observer_;
  bool started_ = false;
  bool complete_ = false;
  bool failed_ = false;
  uint64_t stream_id_ = 0;
  uint64_t total_size_ = 0;
  uint32_t running_crc_ = 0;
  uint64_t received_ = 0;
  // The bundle so far, parsed as its chunks come (made at the first chunk, which gives the size).
  std::optional<BundleStreamParser> parser_;
};

}  // namespace tern

#endif  // TERN_COMMON_CHUNKING_H_
