#include "common/chunking.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/crc32.h"
#include "common/status_macros.h"
#include "google/protobuf/io/zero_copy_stream.h"

namespace tern {

namespace {

// Serializes straight into chunk-sized strings, each CRC-checked as soon as it is full (while
// it is still in cache): one pass over the tensor bytes instead of serializing the whole bundle
// and copying it out again.
class ChunkSink final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  // `total`: the bytes to come, so that a small message does not get (and zero) a whole block.
  ChunkSink(size_t block, size_t total) : block_(block), total_(total) {}

  bool Next(void** data, int* size) override {
    CloseLast();
    const size_t left = total_ > static_cast<size_t>(bytes_) ? total_ - bytes_ : 0;
    const size_t n = left > 0 ? std::min(block_, left) : block_;
    pieces_.emplace_back(n, '\0');
    *data = pieces_.back().data();
    *size = static_cast<int>(n);
    bytes_ += static_cast<int64_t>(n);
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
  const size_t total_;
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
  const size_t size = bundle.ByteSizeLong();
  ChunkSink sink(max_chunk_bytes, size);
  if (size > size_t{INT32_MAX} || !bundle.SerializeToZeroCopyStream(&sink)) {
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
absl::Status BundleAssembler::Check(const ChunkHeader& chunk,
                                    absl::Span<const absl::string_view> data, size_t size) {
  if (!started_) {
    if (chunk.offset != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("first chunk must have offset 0, got ", chunk.offset));
    }
    if (chunk.total_size > max_bundle_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bundle of ", chunk.total_size, " bytes exceeds the limit of ", max_bundle_bytes_));
    }
  } else if (chunk.stream_id != stream_id_ || chunk.total_size != total_size_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk of stream ", chunk.stream_id, " (total ",
                                                   chunk.total_size, ") mixed into stream ",
                                                   stream_id_, " (total ", total_size_, ")"));
  }
  if (chunk.offset != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk at offset ", chunk.offset, ", expected ", received_));
  }
  if (size > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", size, " bytes exceeds ", kMaxChunkBytes));
  }
  const uint64_t total = started_ ? total_size_ : chunk.total_size;
  if (size > total - received_) {
    return absl::InvalidArgumentError("chunk runs past the announced bundle size");
  }
  if (size == 0 && !chunk.last) {
    return absl::InvalidArgumentError("empty chunk that is not the last");
  }
  return absl::OkStatus();
}

absl::Status BundleAssembler::CheckedFeed(const ChunkHeader& chunk,
                                          absl::Span<const absl::string_view> data,
                                          const std::shared_ptr<const void>& owner) {
  // Each piece is parsed (and its payload scanned) right after its CRC, while it is in cache: one
  // read from memory instead of two. Bytes that fail the CRC were parsed, but the chunk is then
  // refused and the assembler poisoned, so nothing built from them is ever handed on.
  uint32_t crc = 0;
  absl::Status parsed = absl::OkStatus();
  for (absl::string_view piece : data) {
    crc = Crc32(piece.data(), piece.size(), crc);
    if (parsed.ok()) parsed = parser_->Feed(piece, owner);
  }
  if (crc != chunk.data_crc32) {  // corruption explains a parse error too: say so first
    return absl::DataLossError(
        absl::StrCat("chunk at offset ", chunk.offset, " fails its CRC-32 check"));
  }
  return parsed;
}

absl::Status BundleAssembler::Add(const v1::BundleChunk& chunk) {
  ChunkHeader h;
  h.stream_id = chunk.stream_id();
  h.offset = chunk.offset();
  h.total_size = chunk.total_size();
  h.data_crc32 = chunk.data_crc32();
  h.last = chunk.last();
  h.bundle_crc32 = chunk.bundle_crc32();
  h.stripes = chunk.stripes();
  const absl::string_view data = chunk.data();
  return Add(h, absl::MakeConstSpan(&data, 1));
}

absl::Status BundleAssembler::Add(const ChunkHeader& chunk,
                                  absl::Span<const absl::string_view> data,
                                  const std::shared_ptr<const void>& owner) {
  if (failed_) return absl::FailedPreconditionError("stream already failed");
  if (complete_) return Fail(absl::InvalidArgumentError("chunk after the last chunk"));
  size_t n = 0;
  for (absl::string_view piece : data) n += piece.size();
  if (absl::Status s = Check(chunk, data, n); !s.ok()) return Fail(std::move(s));
  if (!started_) {
    started_ = true;
    stream_id_ = chunk.stream_id;
    total_size_ = chunk.total_size;
    parser_.emplace(total_size_, observer_);
  }
  if (absl::Status s = CheckedFeed(chunk, data, owner); !s.ok()) return Fail(std::move(s));
  // The chunk's CRC was just checked: the bundle's follows from it without a second pass.
  running_crc_ =
      received_ == 0 ? chunk.data_crc32 : Crc32Combine(running_crc_, chunk.data_crc32, n);
  received_ += n;
  if (chunk.last) {
    if (received_ != total_size_) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("last chunk ends at ", received_, " of ", total_size_, " bytes")));
    }
    if (running_crc_ != chunk.bundle_crc32) {
      return Fail(absl::DataLossError("bundle fails its CRC-32 check"));
    }
    complete_ = true;
  } else if (received_ == total_size_) {
    return Fail(absl::InvalidArgumentError("all bytes received but chunk not marked last"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::TensorBundle> BundleAssembler::Finish() {
  if (!complete_ || !parser_) return absl::FailedPreconditionError("bundle is not complete");
  absl::StatusOr<v1::TensorBundle> bundle = parser_->Finish();
  parser_.reset();
  return bundle;
}

absl::StatusOr<ReceivedBundle> BundleAssembler::FinishInPlace() {
  if (!complete_ || !parser_) return absl::FailedPreconditionError("bundle is not complete");
  absl::StatusOr<ReceivedBundle> bundle = parser_->FinishInPlace();
  parser_.reset();
  return bundle;
}

}  // namespace tern
