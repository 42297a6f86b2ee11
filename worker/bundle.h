// Conversions between the worker's in-memory values and tern.v1.TensorBundle: gossip messages,
// and a model's flat parameter or gradient vector cut into its named tensors.
//
// Every function that reads a bundle treats it as untrusted and fails with InvalidArgument.
#ifndef TERN_WORKER_BUNDLE_H_
#define TERN_WORKER_BUNDLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/chunking.h"
#include "kernels/registry.h"
#include "tern/v1/tensor.pb.h"
#include "worker/algorithm.h"
#include "worker/model.h"

namespace tern {

// A gossip message as a bundle; its parts become the bundle's tensors, in order.
v1::TensorBundle GossipToBundle(GossipMessage&& msg, const std::string& run_id, int64_t round,
                                int sender);
// The reverse, taking the payloads over (pass an rvalue to avoid copying them); checks only
// structure (names unique, numel == expected_numel), not payloads.
absl::StatusOr<GossipMessage> GossipFromBundle(v1::TensorBundle bundle, uint64_t expected_numel);

// `values` (the flat vector of `layout`) as one tensor per layout entry, codec "none", shapes set.
absl::StatusOr<v1::TensorBundle> FlatToBundle(const std::vector<ParamTensor>& layout,
                                              absl::Span<const float> values);

// `values` (the flat vector of `layout`) as one tensor per layout entry, each encoded by `codec`
// (seeded with options.seed + the tensor's index), shapes set. With `residual` (as long as
// `values`), error feedback: each tensor encodes values + residual, and the residual becomes
// what that encoding lost.
absl::StatusOr<v1::TensorBundle> EncodeFlatToBundle(const std::vector<ParamTensor>& layout,
                                                    absl::Span<const float> values, Codec& codec,
                                                    const EncodeOptions& options,
                                                    std::vector<float>* residual);

// The bundle's encoded bytes as byte counters count them: payloads plus 4 bytes per scale (no
// names or framing).
uint64_t PayloadBytes(const v1::TensorBundle& bundle);

// Decodes `bundle` into `out` (the flat vector of `layout`): the tensors must be exactly the
// layout's, same names, order and element counts; any registered codec is accepted.
absl::Status BundleToFlat(const v1::TensorBundle& bundle, const std::vector<ParamTensor>& layout,
                          const CodecRegistry& codecs, absl::Span<float> out);

// The layout a registering trainer declares: names, shapes and offsets in bundle order.
absl::StatusOr<std::vector<ParamTensor>> LayoutFromBundle(const v1::TensorBundle& bundle,
                                                          uint64_t max_params);

// True when both layouts name the same tensors with the same shapes, in the same order.
bool SameLayout(const std::vector<ParamTensor>& a, const std::vector<ParamTensor>& b);

// The chunk a streamed message carries: the message itself, or its `chunk` field.
inline const v1::BundleChunk& ChunkOf(const v1::BundleChunk& c) { return c; }
template <typename Msg>
const v1::BundleChunk& ChunkOf(const Msg& m) {
  return m.chunk();
}

// Reads one chunked bundle from a synchronous gRPC stream of `Msg` (a reader or reader-writer);
// `first`, when given, receives the stream's first message (where header fields ride). After a
// bad chunk it reads the stream to its end, so the caller's Finish() returns the server's status
// instead of waiting on unread messages; the caller still Finish()es the stream.
template <typename Msg, typename Reader>
absl::StatusOr<v1::TensorBundle> ReadChunkedBundle(Reader* reader, Msg* first = nullptr) {
  BundleAssembler assembler(uint64_t{1} << 31);
  Msg msg;
  bool got_first = false;
  absl::Status s;
  while (!assembler.complete() && reader->Read(&msg)) {
    if (first != nullptr && !got_first) *first = msg;
    got_first = true;
    s = assembler.Add(ChunkOf(msg));
    if (!s.ok()) {
      while (reader->Read(&msg)) {
      }
      return s;
    }
  }
  if (!assembler.complete()) return absl::DataLossError("stream ended before the last chunk");
  return assembler.Finish();
}

}  // namespace tern

#endif  // TERN_WORKER_BUNDLE_H_
