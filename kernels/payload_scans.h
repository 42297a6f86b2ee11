// The payload scans of one bundle being received: a tensor whose codec (read from the fields
// sent before its payload) has a PayloadScan is checked as its bytes arrive, while each chunk is
// in cache; the receiver then takes its verdict and norm from the scan instead of passing over
// the payload once more after the last byte (RoundEngine::Deliver).
//
// Thread-safety: not thread-safe (one per incoming stream).
#ifndef TERN_KERNELS_PAYLOAD_SCANS_H_
#define TERN_KERNELS_PAYLOAD_SCANS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/bundle_stream.h"
#include "kernels/codec.h"
#include "kernels/registry.h"

namespace tern {

class PayloadScans final : public PayloadObserver {
 public:
  // `codecs` must outlive this.
  explicit PayloadScans(const CodecRegistry* codecs) : codecs_(codecs) {}

  void Begin(size_t index, absl::string_view fields, uint64_t size) override;
  void Bytes(size_t index, absl::string_view bytes) override;
  // True where the tensor's codec decodes a payload in pieces (Codec::ReadsPieces).
  bool InPlace(size_t index) const override;

  // Tensor `index`'s scan if it ran under `t`'s codec over all of t's payload; else null (check
  // `t` the usual way).
  PayloadScan* For(size_t index, const EncodedTensor& t) const;

 private:
  struct Entry {
    std::string codec;
    std::unique_ptr<PayloadScan> scan;  // may be null
    bool reads_pieces = false;
  };
  const CodecRegistry* const codecs_;
  std::vector<Entry> entries_;  // by tensor index
};

}  // namespace tern

#endif  // TERN_KERNELS_PAYLOAD_SCANS_H_
