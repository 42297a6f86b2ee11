#include "kernels/payload_scans.h"

#include "tern/v1/tensor.pb.h"

namespace tern {

void PayloadScans::Begin(size_t index, absl::string_view fields, uint64_t size) {
  v1::EncodedTensor header;  // small: everything before the payload
  if (!header.ParseFromArray(fields.data(), static_cast<int>(fields.size()))) return;
  absl::StatusOr<const Codec*> decoder = codecs_->DecoderFor(header.codec());
  if (!decoder.ok()) return;  // refused later, the usual way
  if (entries_.size() <= index) entries_.resize(index + 1);
  entries_[index] = {header.codec(), (*decoder)->NewPayloadScan(), (*decoder)->ReadsPieces()};
}

bool PayloadScans::InPlace(size_t index) const {
  return index < entries_.size() && entries_[index].reads_pieces;
}

void PayloadScans::Bytes(size_t index, absl::string_view bytes) {
  if (index < entries_.size() && entries_[index].scan != nullptr) {
    entries_[index].scan->Feed(bytes);
  }
}

PayloadScan* PayloadScans::For(size_t index, const EncodedTensor& t) const {
  if (index >= entries_.size()) return nullptr;
  const Entry& e = entries_[index];
  if (e.scan == nullptr || e.codec != t.codec || e.scan->fed() != t.PayloadSize()) return nullptr;
  return e.scan.get();
}

}  // namespace tern
