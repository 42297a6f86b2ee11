#include "common/chunking.h"

#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/crc32.h"
#include "common/status_macros.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace tern {

namespace {

// Serializes straight into chunk-sized strings, each CRC-checked as soon as it is full (while
// it is still in cache): one pass over the tensor bytes instead of serializing the whole bundle
// and copying it out again.
class ChunkSink final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  explicit ChunkSink(size_t block) : block_(block) {}

  bool Next(void** data, int* size) override {
    CloseLast();
    pieces_.emplace_back(block_, '\0');
    *data = pieces_.back().data();
    *size = static_cast<int>(block_);
    bytes_ += static_cast<int64_t>(block_);
    return true;
  }
  void BackUp(int count) override {
    if (count <= 0) return;  // protobuf backs up 0 bytes even when it never asked for a buffer
    std::string& p = pieces_.back();
    p.erase(p.size() - std::min(p.size(), static_cast<size_t>(count)));
    bytes_ -= count;
  }
  int64_t ByteCount() const override { return bytes_; }

  // The pieces (none empty) and their CRCs. REQUIRES: serialization is over.
  void Finish(std::vector<std::string>* pieces, std::vector<uint32_t>* crcs) {
    CloseLast();
    *pieces = std::move(pieces_);
    *crcs = std::move(crcs_);
  }

 private:
  void CloseLast() {
    if (pieces_.size() == crcs_.size()) return;
    if (pieces_.back().empty()) {
      pieces_.pop_back();
    } else {
      crcs_.push_back(Crc32(pieces_.back().data(), pieces_.back().size()));
    }
  }

  const size_t block_;
  std::vector<std::string> pieces_;
  std::vector<uint32_t> crcs_;
  int64_t bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<v1::BundleChunk>> ChunkBundle(const v1::TensorBundle& bundle,
                                                         uint64_t stream_id,
                                                         size_t max_chunk_bytes) {
  if (max_chunk_bytes == 0 || max_chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk size must be in [1, ", kMaxChunkBytes, "], got ", max_chunk_bytes));
  }
  ChunkSink sink(max_chunk_bytes);
  if (bundle.ByteSizeLong() > size_t{INT32_MAX} || !bundle.SerializeToZeroCopyStream(&sink)) {
    return absl::InternalError("bundle does not serialize (over 2 GiB?)");
  }
  std::vector<std::string> pieces;
  std::vector<uint32_t> crcs;
  sink.Finish(&pieces, &crcs);
  const uint64_t total = static_cast<uint64_t>(sink.ByteCount());
  std::vector<v1::BundleChunk> chunks(std::max<size_t>(pieces.size(), 1));
  uint64_t offset = 0;
  uint32_t bundle_crc = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    v1::BundleChunk& c = chunks[i];
    c.set_stream_id(stream_id);
    c.set_offset(offset);
    c.set_total_size(total);
    if (i < pieces.size()) {  // else: an empty bundle, sent as one empty last chunk
      const size_t n = pieces[i].size();
      c.set_data_crc32(crcs[i]);
      bundle_crc = i == 0 ? crcs[i] : Crc32Combine(bundle_crc, crcs[i], n);
      c.set_data(std::move(pieces[i]));
      offset += n;
    }
  }
  chunks.back().set_last(true);
  chunks.back().set_bundle_crc32(bundle_crc);
  return chunks;
}

// Every check a chunk must pass before it is kept.
absl::Status BundleAssembler::Check(const v1::BundleChunk& chunk) {
  if (!started_) {
    if (chunk.offset() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("first chunk must have offset 0, got ", chunk.offset()));
    }
    if (chunk.total_size() > max_bundle_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bundle of ", chunk.total_size(), " bytes exceeds the limit of ", max_bundle_bytes_));
    }
  } else if (chunk.stream_id() != stream_id_ || chunk.total_size() != total_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of stream ", chunk.stream_id(), " (total ", chunk.total_size(),
                     ") mixed into stream ", stream_id_, " (total ", total_size_, ")"));
  }
  if (chunk.offset() != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk at offset ", chunk.offset(), ", expected ", received_));
  }
  if (chunk.data().size() > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", chunk.data().size(), " bytes exceeds ", kMaxChunkBytes));
  }
  const uint64_t total = started_ ? total_size_ : chunk.total_size();
  if (chunk.data().size() > total - received_) {
    return absl::InvalidArgumentError("chunk runs past the announced bundle size");
  }
  if (chunk.data().empty() && !chunk.last()) {
    return absl::InvalidArgumentError("empty chunk that is not the last");
  }
  if (Crc32(chunk.data().data(), chunk.data().size()) != chunk.data_crc32()) {
    return absl::DataLossError(
        absl::StrCat("chunk at offset ", chunk.offset(), " fails its CRC-32 check"));
  }
  return absl::OkStatus();
}

absl::Status BundleAssembler::Add(v1::BundleChunk&& chunk) {
  if (failed_) return absl::FailedPreconditionError("stream already failed");
  if (complete_) return Fail(absl::InvalidArgumentError("chunk after the last chunk"));
  if (absl::Status s = Check(chunk); !s.ok()) return Fail(std::move(s));
  if (!started_) {
    started_ = true;
    stream_id_ = chunk.stream_id();
    total_size_ = chunk.total_size();
  }
  // The chunk's CRC was just checked: the bundle's follows from it without a second pass.
  const size_t n = chunk.data().size();
  running_crc_ =
      received_ == 0 ? chunk.data_crc32() : Crc32Combine(running_crc_, chunk.data_crc32(), n);
  received_ += n;
  if (n > 0) pieces_.push_back(std::move(*chunk.mutable_data()));
  if (chunk.last()) {
    if (received_ != total_size_) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("last chunk ends at ", received_, " of ", total_size_, " bytes")));
    }
    if (running_crc_ != chunk.bundle_crc32()) {
      return Fail(absl::DataLossError("bundle fails its CRC-32 check"));
    }
    complete_ = true;
  } else if (received_ == total_size_) {
    return Fail(absl::InvalidArgumentError("all bytes received but chunk not marked last"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::TensorBundle> BundleAssembler::Finish() {
  if (!complete_) return absl::FailedPreconditionError("bundle is not complete");
  // Parsed straight from the chunks: one copy of the tensor bytes, into the bundle's fields.
  std::deque<google::protobuf::io::ArrayInputStream> arrays;  // neither copied nor moved
  std::vector<google::protobuf::io::ZeroCopyInputStream*> streams;
  for (const std::string& p : pieces_) {
    arrays.emplace_back(p.data(), static_cast<int>(p.size()));
    streams.push_back(&arrays.back());
  }
  google::protobuf::io::ConcatenatingInputStream input(streams.data(),
                                                       static_cast<int>(streams.size()));
  v1::TensorBundle bundle;
  const bool parsed = bundle.ParseFromZeroCopyStream(&input);
  pieces_.clear();
  if (!parsed) return absl::InvalidArgumentError("reassembled bytes are not a TensorBundle");
  return bundle;
}

}  // namespace tern
