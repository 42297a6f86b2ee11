// The codec interface. A codec turns a float32 tensor into a compact payload and back; every
// payload carries its codec name with an encoding version, its parameters and its element count, so
// a decoder never guesses (docs/wire-format.md). Codecs are created from spec strings such as
// "stc:ratio=0.01" through a CodecRegistry (kernels/registry.h).
//
// Thread-safety: Encode may keep per-tensor state (PowerSGD's warm start) and is not thread-safe;
// use one codec instance per tensor stream. Decode and DecodeAccumulate are const and thread-safe.
//
// Example:
//   auto registry = NewBuiltinCodecRegistry();
//   TERN_ASSIGN_OR_RETURN(auto codec, registry->Create("topk:ratio=0.01"));
//   EncodedTensor enc;
//   TERN_RETURN_IF_ERROR(codec->Encode(grad, {.seed = step}, &enc));
//   TERN_RETURN_IF_ERROR(codec->DecodeAccumulate(EncodedView::Of(enc), 0.25f, sum));
#ifndef TERN_KERNELS_CODEC_H_
#define TERN_KERNELS_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/payload_pieces.h"

namespace tern {

class ThreadPool;

// An encoded tensor as the kernels produce it; mirrors tern.v1.EncodedTensor (kernels/wire.h
// converts) without the logical shape and dtype, which belong to the caller.
struct EncodedTensor {
  std::string codec;          // name with encoding version, e.g. "stc.v1"
  std::string params;         // canonical parameters, e.g. "ratio=0.01"
  uint64_t numel = 0;         // elements of the decoded tensor
  std::vector<float> scales;  // per-tensor / per-block scales (count fixed by the codec)
  std::string payload;        // codec body, layout in docs/wire-format.md
  // A received payload read where it arrived instead (then `payload` is empty): see
  // common/payload_pieces.h. Only codecs whose decoder ReadsPieces() are handed one.
  PayloadPieces in_place;

  size_t PayloadSize() const { return payload.size() + in_place.size; }
  // Bytes this tensor costs on the wire, excluding protobuf framing and the name strings.
  size_t ByteSize() const { return PayloadSize() + 4 * scales.size(); }
};

// A read-only view of an encoded tensor (for example over a received protobuf). The viewed memory
// must outlive the view.
struct EncodedView {
  absl::string_view codec;
  uint64_t numel = 0;
  absl::Span<const float> scales;
  absl::Span<const uint8_t> payload;
  // The payload in pieces, in order, where it was received in place (then `payload` is empty).
  // Codec's public calls join them into one buffer first unless the codec ReadsPieces().
  absl::Span<const absl::string_view> pieces;
  // The payload already passed this codec's Validate, Norm or PayloadScan (a message checked on
  // arrival): decoding may skip the checks of its values (Inf and NaN in cast payloads), which
  // would read it once more. Sizes and bounds are checked whatever this says.
  bool checked = false;

  size_t PayloadSize() const {
    size_t n = payload.size();
    for (absl::string_view p : pieces) n += p.size();
    return n;
  }

  static EncodedView Of(const EncodedTensor& t) {
    return EncodedView{t.codec, t.numel, t.scales,
                       absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(t.payload.data()),
                                                 t.payload.size()),
                       t.in_place.pieces};
  }
};

// One tensor of a flat vector holding several (a model's layout, in order): `numel` elements
// viewed as a [rows, numel / rows] matrix (PyTorch's view of a weight: rows = shape[0]).
struct TensorBlock {
  uint64_t numel = 0;
  uint64_t rows = 0;
};

struct EncodeOptions {
  // Key of the counter-based generator: stochastic codecs draw element i's randomness from
  // (seed, i), so a payload is reproducible. Use a fresh seed per step (e.g. hash of step, rank).
  uint64_t seed = 0;
  // Logical shape of the tensor. PowerSGD views it as a [shape[0], numel / shape[0]] matrix; empty
  // means a flat vector. Not owned; must outlive the call.
  absl::Span<const int64_t> shape;
  // The tensors the input is made of, consecutive and covering it (a whole model sent as one
  // vector); empty: one tensor of `shape`. Codecs with per-tensor structure (PowerSGD) encode
  // each on its own and carry the blocks in the payload; the others ignore them. Not owned.
  absl::Span<const TensorBlock> blocks;
  // Optional pool that splits large tensors across threads; results are identical without it.
  ThreadPool* pool = nullptr;
};

// The k largest magnitudes of an input, as SelectTopK (kernels/select.h) chooses them: `indices`
// ascending, `values` the input there. What a caller that selects in a pass of its own hands a
// top-k codec instead of the input (CHOCO selects while it computes x - x_hat, which then never
// goes to memory). Not owned; must outlive the call.
struct TopKSelection {
  uint64_t numel = 0;
  absl::Span<const uint32_t> indices;
  absl::Span<const float> values;
};

// A payload's check and norm computed from its bytes as they arrive, in order (a receiver feeds
// each chunk while it is in cache, instead of passing over a large message again after its last
// byte). Not thread-safe; one per payload.
class PayloadScan {
 public:
  virtual ~PayloadScan() = default;
  virtual void Feed(absl::string_view bytes) = 0;
  // Bytes fed so far.
  virtual uint64_t fed() const = 0;
  // Codec::Norm(in), bit for bit, where `in` is the tensor whose payload was fed: all of it, in
  // order (fed() == in.payload.size(); else FailedPrecondition).
  virtual absl::StatusOr<double> Finish(const EncodedView& in) = 0;
};

// A tensor a decoded payload is added to, and its weight (Codec::DecodeAccumulateEach).
struct WeightedTarget {
  float weight;
  absl::Span<float> out;
};

class Codec {
 public:
  virtual ~Codec() = default;

  // Name with encoding version, e.g. "stc.v1"; changes whenever the payload layout changes.
  virtual absl::string_view Name() const = 0;
  // Canonical spec that recreates this codec, e.g. "stc:ratio=0.01".
  virtual std::string Spec() const = 0;
  // True when Decode(Encode(x)) reproduces x bit for bit.
  virtual bool lossless() const { return false; }

  // Encodes `input` into `out`, overwriting it. Reuses out->payload's buffer when it can, so
  // encoding into the same EncodedTensor every step does not reallocate.
  virtual absl::Status Encode(absl::Span<const float> input, const EncodeOptions& options,
                              EncodedTensor* out) = 0;

  // The state an encoder carries from one Encode to the next that no payload holds (DCT's
  // threshold and the encodes until its next estimate), as bytes: a caller that keeps its own
  // state across a restart (a server's checkpoint, beside its residual) keeps these beside it and
  // hands them to a new codec of the same spec, which then encodes as this one would have. ""
  // where there is none.
  virtual std::string SaveEncoderState() const { return ""; }
  // Takes what SaveEncoderState gave; InvalidArgument for bytes it could not have given (the
  // codec is then as new).
  virtual absl::Status RestoreEncoderState(absl::string_view state);

  // For the codecs whose payload depends on their input only through its k largest magnitudes as
  // SelectTopK chooses them (top-k, STC): that k for an input of n elements. 0 for the others.
  virtual size_t TopK(uint64_t /*n*/) const { return 0; }
  // What Encode writes for an input whose selection is `selection` (TopK(numel) entries), bit for
  // bit. InvalidArgument for a selection of another size or not ascending; Unimplemented where
  // TopK is 0.
  virtual absl::Status EncodeSelection(const TopKSelection& selection, const EncodeOptions& options,
                                       EncodedTensor* out);

  // Decodes into `out` (size must equal in.numel). The bytes are untrusted: a payload that is
  // truncated, oversize, of another codec or internally inconsistent yields InvalidArgument and
  // leaves `out` unspecified, never out-of-bounds accesses.
  absl::Status Decode(const EncodedView& in, absl::Span<float> out,
                      ThreadPool* pool = nullptr) const;
  // out += weight * decode(in), without materialising the decoded tensor. Every codec validates
  // the whole payload before writing, so on error `out` is untouched.
  absl::Status DecodeAccumulate(const EncodedView& in, float weight, absl::Span<float> out,
                                ThreadPool* pool = nullptr) const;
  // DecodeAccumulate into each target in turn, bit for bit, with the payload read once where the
  // codec can (a sparse payload's positions are parsed once for all targets): for a receiver that
  // adds one message to several tensors. On error no target is touched.
  absl::Status DecodeAccumulateEach(const EncodedView& in,
                                    absl::Span<const WeightedTarget> targets) const;
  // out += Σ_j weights[j] · decode(ins[j]), bit for bit as DecodeAccumulate of each in turn, in
  // order: for a receiver that sums several messages of this codec. Where the codec can, one
  // pass over `out` (the sign codec adds a block of every message before the next block, so
  // `out` is read and written once rather than once per message). On error `out` is unspecified.
  absl::Status DecodeAccumulateMany(absl::Span<const EncodedView> ins,
                                    absl::Span<const float> weights, absl::Span<float> out) const;
  // The verdict Decode would give on `in`, without writing a tensor: what a receiver checks a
  // message with on arrival, before it is decoded once into the model.
  absl::Status Validate(const EncodedView& in) const;
  // ||decode(in)||₂ with Validate's verdict: what a receiver's norm guard measures on arrival.
  absl::StatusOr<double> Norm(const EncodedView& in) const;
  // Norm as the payload arrives, or null (the default) where the check needs the whole payload
  // at once; the cast codecs' check and norm are one pass over their words.
  virtual std::unique_ptr<PayloadScan> NewPayloadScan() const { return nullptr; }
  // True when the *Impl calls below read a view's `pieces` themselves (a received payload left
  // where it arrived); the default gets them joined into one buffer (a copy) first.
  virtual bool ReadsPieces() const { return false; }

 protected:
  // `in` with its pieces joined into `flat` unless this codec ReadsPieces().
  EncodedView InOnePlace(const EncodedView& in, std::string* flat) const;

  // Codec-specific decoding, after the codec name and element count were checked. With
  // accumulate == false, `out` is overwritten (weight is 1).
  virtual absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                                  absl::Span<float> out, ThreadPool* pool) const = 0;
  // DecodeAccumulateEach after the same checks on every target. The default is DecodeImpl per
  // target (the first refuses a bad payload before any is touched).
  virtual absl::Status DecodeAccumulateEachImpl(const EncodedView& in,
                                                absl::Span<const WeightedTarget> targets) const;
  // DecodeAccumulateMany after the same checks on every view (weights the views' size). The
  // default is DecodeImpl per view, in order.
  virtual absl::Status DecodeAccumulateManyImpl(absl::Span<const EncodedView> ins,
                                                absl::Span<const float> weights,
                                                absl::Span<float> out) const;
  // Codec-specific validation after the same checks. The default decodes into a per-thread
  // scratch tensor; a codec whose payload can be checked without decoding (the sparse ones:
  // positions only) overrides it.
  virtual absl::Status ValidateImpl(const EncodedView& in) const;
  // Codec-specific norm after the same checks. The default decodes into the per-thread scratch;
  // codecs whose norm follows from the payload (sparse values, STC's k and mu, cast words)
  // override it.
  virtual absl::StatusOr<double> NormImpl(const EncodedView& in) const;
};

// ||x||₂², summed in double (fp32 sums lose the tail over a million elements; the sum of finite
// floats cannot overflow a double), and ||x||₂.
double SquaredL2Norm(absl::Span<const float> x);
// The same over `n` fp32 words, little-endian, at any alignment (a payload read in place): the
// same bits as SquaredL2Norm of the floats they hold.
double SquaredL2NormOfWords(const uint8_t* words, size_t n);
double L2Norm(absl::Span<const float> x);

}  // namespace tern

#endif  // TERN_KERNELS_CODEC_H_
