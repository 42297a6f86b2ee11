#include "core/rpc/raw_chunk.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace tern {
namespace {

// Field numbers of tern.v1.BundleChunk.
enum Field : uint32_t {
  kStreamId = 1,
  kOffset = 2,
  kTotalSize = 3,
  kData = 4,
  kDataCrc = 5,
  kLast = 6,
  kBundleCrc = 7,
  kStripes = 8,
};

// A bounds-checked reader over the pieces a message arrived in; every read fails rather than
// run past the last byte.
class PiecesReader {
 public:
  explicit PiecesReader(const std::vector<absl::string_view>& pieces) : p_(pieces) { Next(); }

  bool done() const { return i_ == p_.size(); }

  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = static_cast<uint8_t>(p_[i_][off_++]);
    Next();
    return true;
  }
  // A varint of at most `max_bytes` bytes; bits past 64 are dropped, as protobuf drops them.
  bool Varint(int max_bytes, uint64_t* v) {
    uint64_t out = 0;
    for (int k = 0; k < max_bytes; ++k) {
      uint8_t b;
      if (!Byte(&b)) return false;
      out |= static_cast<uint64_t>(b & 0x7f) << (7 * k);
      if ((b & 0x80) == 0) {
        *v = out;
        return true;
      }
    }
    return false;
  }
  // The next n bytes as views (appended to `out`, when given).
  bool Take(uint64_t n, std::vector<absl::string_view>* out) {
    while (n > 0) {
      if (done()) return false;
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, p_[i_].size() - off_));
      if (out != nullptr) out->push_back(p_[i_].substr(off_, k));
      off_ += k;
      n -= k;
      Next();
    }
    return true;
  }

 private:
  void Next() {
    while (i_ < p_.size() && off_ == p_[i_].size()) {
      ++i_;
      off_ = 0;
    }
  }

  const std::vector<absl::string_view>& p_;
  size_t i_ = 0;
  size_t off_ = 0;
};

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed BundleChunk: ", what));
}

// One field; known fields of the wrong wire type are skipped as unknown, as protobuf does.
absl::Status ReadField(PiecesReader& r, RawChunk& c) {
  uint64_t tag;
  if (!r.Varint(5, &tag)) return Bad("bad tag");
  tag &= UINT32_MAX;  // a fifth byte's bits past 32 are dropped, as protobuf drops them
  const uint64_t field = tag >> 3;
  if (field == 0) return Bad("field number 0");
  switch (tag & 7) {
    case 0: {
      uint64_t v;
      if (!r.Varint(10, &v)) return Bad("bad varint");
      if (field == kStreamId) c.header.stream_id = v;
      if (field == kOffset) c.header.offset = v;
      if (field == kTotalSize) c.header.total_size = v;
      if (field == kDataCrc) c.header.data_crc32 = static_cast<uint32_t>(v);
      if (field == kLast) c.header.last = v != 0;
      if (field == kBundleCrc) c.header.bundle_crc32 = static_cast<uint32_t>(v);
      if (field == kStripes) c.header.stripes = static_cast<uint32_t>(v);
      return absl::OkStatus();
    }
    case 1:
      return r.Take(8, nullptr) ? absl::OkStatus() : Bad("truncated fixed64");
    case 5:
      return r.Take(4, nullptr) ? absl::OkStatus() : Bad("truncated fixed32");
    case 2: {
      uint64_t n;
      if (!r.Varint(5, &n) || n > INT32_MAX) return Bad("bad length");
      if (field != kData) return r.Take(n, nullptr) ? absl::OkStatus() : Bad("truncated field");
      c.data.clear();  // the last one wins
      if (!r.Take(n, &c.data)) return Bad("truncated data");
      c.data_size = static_cast<size_t>(n);
      return absl::OkStatus();
    }
    default:
      return Bad(absl::StrCat("wire type ", tag & 7, " of field ", field));
  }
}

void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

}  // namespace

absl::StatusOr<RawChunk> ParseRawChunkPieces(std::vector<absl::string_view> pieces) {
  RawChunk c;
  for (absl::string_view p : pieces) c.message_size += p.size();
  PiecesReader r(pieces);
  while (!r.done()) {
    if (absl::Status s = ReadField(r, c); !s.ok()) return s;
  }
  return c;
}

absl::StatusOr<RawChunk> ParseRawChunk(const grpc::ByteBuffer& message) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (!message.Valid() || !message.Dump(slices.get()).ok()) return Bad("unreadable message");
  std::vector<absl::string_view> pieces;
  pieces.reserve(slices->size());
  for (const grpc::Slice& s : *slices) {
    pieces.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  absl::StatusOr<RawChunk> c = ParseRawChunkPieces(std::move(pieces));
  if (c.ok()) c->owner = std::move(slices);  // the views point into these
  return c;
}

grpc::ByteBuffer RawChunkMessage(const v1::BundleChunk& chunk, std::shared_ptr<const void> owner,
                                 const ChunkStripe* stripe) {
  std::string header;
  {
    google::protobuf::io::StringOutputStream stream(&header);
    google::protobuf::io::CodedOutputStream out(&stream);
    const auto varint = [&out](uint32_t field, uint64_t v) {
      if (v == 0) return;  // proto3 leaves defaults out
      out.WriteTag(field << 3);
      out.WriteVarint64(v);
    };
    varint(kStreamId, stripe != nullptr ? stripe->stream_id : chunk.stream_id());
    varint(kOffset, chunk.offset());
    varint(kTotalSize, chunk.total_size());
    varint(kDataCrc, chunk.data_crc32());
    varint(kLast, chunk.last() ? 1 : 0);
    varint(kBundleCrc, chunk.bundle_crc32());
    varint(kStripes, stripe != nullptr ? stripe->stripes : chunk.stripes());
    if (!chunk.data().empty()) {
      out.WriteTag(kData << 3 | 2);
      out.WriteVarint32(static_cast<uint32_t>(chunk.data().size()));
    }
  }
  grpc::Slice parts[2] = {grpc::Slice(header), grpc::Slice()};
  if (chunk.data().empty()) return grpc::ByteBuffer(parts, 1);
  parts[1] = grpc::Slice(const_cast<char*>(chunk.data().data()), chunk.data().size(), &ReleaseOwner,
                         new std::shared_ptr<const void>(std::move(owner)));
  return grpc::ByteBuffer(parts, 2);
}

}  // namespace tern
