// Parses a serialized tern.v1.TensorBundle while its bytes arrive, in pieces of any size (a
// chunked stream's chunks). Each tensor's payload is copied once, straight from the pieces into
// a string of its announced size, while the next pieces are still on the wire; everything else
// (names, codecs, shapes, scales, unknown fields: small) is gathered per message and parsed by
// protobuf at the end. So a received bundle costs one copy of its tensor bytes, made as they
// arrive, instead of a parse of the whole bundle after its last byte.
//
// The bytes are untrusted: lengths past their message, groups, bad varints, a second payload in
// one tensor or a second tensor in one NamedTensor are InvalidArgument, never a crash. A payload
// string reserves its announced length (at most the bundle's total, which the caller bounds) and
// is filled as bytes come. Fed with an owner of its bytes (a raw receiver's gRPC slices), it
// copies nothing of a large payload whose reader takes pieces (PayloadObserver::InPlace): it keeps
// views of the pieces and their owners instead (FinishInPlace). What it accepts, protobuf's parser
// accepts and reads the same (tested); it refuses the duplicates above, which protobuf would merge
// and no tern sender writes.
//
// Thread-safety: not thread-safe (one per incoming stream).
#ifndef TERN_COMMON_BUNDLE_STREAM_H_
#define TERN_COMMON_BUNDLE_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/payload_pieces.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// Sees each tensor's payload bytes as they arrive, to check them while they are in cache
// (kernels/payload_scans.h). Called on the parser's thread, in order.
class PayloadObserver {
 public:
  virtual ~PayloadObserver() = default;
  // Tensor `index`'s payload of `size` bytes starts; `fields` are the serialized fields of its
  // EncodedTensor seen before it (a tern sender's codec, numel, shape and scales).
  virtual void Begin(size_t index, absl::string_view fields, uint64_t size) = 0;
  // The next bytes of tensor `index`'s payload.
  virtual void Bytes(size_t index, absl::string_view bytes) = 0;
  // After Begin: true when tensor `index`'s payload is read in pieces where it arrived (its
  // codec's decoder takes pieces), so a parser fed with owners keeps it there, uncopied.
  virtual bool InPlace(size_t /*index*/) const { return false; }
};

// A bundle as a parser fed with owners gives it: the payloads it kept in place are empty in
// `bundle` and held in `in_place` (by tensor index; empty where the payload is in `bundle`).
struct ReceivedBundle {
  v1::TensorBundle bundle;
  std::vector<PayloadPieces> in_place;
};

// Payloads smaller than this are copied even when they could stay in place: holding a slice for
// a few bytes costs more than copying them.
inline constexpr uint64_t kInPlaceMinBytes = uint64_t{64} << 10;

class BundleStreamParser {
 public:
  // `total_size`: the bytes of the whole serialized bundle. `observer` (may be null) must outlive
  // the parser. Payloads of at least `in_place_min_bytes` may stay in place (Feed).
  explicit BundleStreamParser(uint64_t total_size, PayloadObserver* observer = nullptr,
                              uint64_t in_place_min_bytes = kInPlaceMinBytes);

  // The next bytes. After an error every call fails. With an `owner` that keeps `piece` valid
  // (and unchanged) while it lives, the parts of large payloads read in place (see above) are
  // kept as views, not copied.
  absl::Status Feed(absl::string_view piece, const std::shared_ptr<const void>& owner = nullptr);
  // The bundle, once all total_size bytes were fed, every payload in it.
  absl::StatusOr<v1::TensorBundle> Finish();
  // The same with the payloads kept in place left there.
  absl::StatusOr<ReceivedBundle> FinishInPlace();

 private:
  // The three nested messages a payload sits in.
  enum class Level { kBundle, kNamed, kEncoded };
  // What the bytes being read are.
  enum class State { kTag, kVarint, kFixed, kLength, kCopy, kPayload };

  struct Tensor {
    std::string named_rest;    // NamedTensor's fields but `tensor`
    std::string encoded_rest;  // EncodedTensor's fields but `payload`
    std::string payload;
    PayloadPieces in_place;  // the payload instead, where `keep`
    bool keep = false;
    bool has_encoded = false;
    bool has_payload = false;
  };
  struct Frame {
    Level level;
    uint64_t end;  // offset just past this message's bytes
  };

  absl::Status Fail(absl::Status s);
  absl::Status Step(absl::string_view* piece);
  // Takes `n` bytes of the payload under way (kPayload).
  void TakePayload(absl::string_view bytes);
  // Reads one byte of the tag or length being gathered in scratch_ (at most 5 bytes, as protobuf
  // reads them); true when complete.
  absl::StatusOr<bool> VarintByte(absl::string_view* piece, uint64_t* value);
  absl::Status OnTag(uint64_t tag);
  absl::Status OnLength(uint64_t length);
  // Pops every frame that ends at the current offset.
  void CloseFrames();
  std::string& Rest();
  uint64_t FrameLeft() const { return frames_.back().end - offset_; }

  const uint64_t total_;
  PayloadObserver* const observer_;
  const uint64_t in_place_min_;
  const std::shared_ptr<const void>* owner_ = nullptr;  // of the piece being fed, if any
  uint64_t offset_ = 0;
  bool failed_ = false;
  State state_ = State::kTag;
  uint64_t left_ = 0;        // bytes left of a kFixed, kCopy or kPayload value
  int field_ = 0;            // the field whose value is being read
  std::string scratch_;      // a tag's (and length's) bytes until we know where they go
  size_t varint_start_ = 0;  // where in scratch_ the varint being read starts
  std::string bundle_rest_;
  std::vector<Frame> frames_;
  std::vector<Tensor> tensors_;
};

}  // namespace tern

#endif  // TERN_COMMON_BUNDLE_STREAM_H_
