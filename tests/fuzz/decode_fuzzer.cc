// libFuzzer target for one codec's decoder (TERN_FUZZ_CODEC, its spec name; the decoder is the
// one of its current wire name): the input is split into a small header (element count, scale
// count, weight) and the payload; decoding must return OK or InvalidArgument and never touch
// memory out of bounds (ASan + UBSan builds), Validate must give the same verdict, and decoding
// into several targets at once must write what one DecodeAccumulate per target writes. The same
// payload cut into pieces (as a receiver may leave it, EncodedView::pieces; the cut sizes from
// the header's fourth byte) must decode to the same verdict and the same bits, Norm must give
// Validate's verdict, and the two summed at once (DecodeAccumulateMany) what each added in turn
// gives.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/builtin.h"

namespace {

const tern::CodecRegistry& Registry() {
  static const auto* registry = tern::NewBuiltinCodecRegistry().release();
  return *registry;
}

const tern::Codec& Decoder() {
  static const tern::Codec* decoder = [] {
    auto codec = Registry().Create(TERN_FUZZ_CODEC);
    if (!codec.ok()) std::abort();
    auto d = Registry().DecoderFor((*codec)->Name());
    if (!d.ok()) std::abort();
    return *d;
  }();
  return *decoder;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  // numel up to 65535 keeps each run fast; scales count 0..15 from the input too.
  uint16_t numel;
  std::memcpy(&numel, data, 2);
  const size_t nscales = data[2] & 15;
  const bool accumulate = data[3] & 1;
  const size_t cut = 1 + (data[3] >> 1);  // 1..128 bytes a piece
  data += 4;
  size -= 4;
  std::vector<float> scales(nscales);
  const size_t scale_bytes = std::min(size, nscales * 4);
  if (scale_bytes > 0) std::memcpy(scales.data(), data, scale_bytes);
  data += scale_bytes;
  size -= scale_bytes;
  const tern::Codec& decoder = Decoder();
  tern::EncodedView view{decoder.Name(), numel, scales, absl::Span<const uint8_t>(data, size), {}};
  std::vector<float> out(numel, 1.0f);
  absl::Status s = accumulate ? decoder.DecodeAccumulate(view, 0.5f, absl::MakeSpan(out))
                              : decoder.Decode(view, absl::MakeSpan(out));
  if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) std::abort();
  // What a receiver checks on arrival must agree with decoding, byte for byte of the verdict.
  if (decoder.Validate(view).ok() != s.ok()) std::abort();
  // Decoding into several targets at once is DecodeAccumulate into each: same verdict, same bits,
  // nothing touched on error.
  std::vector<float> a(numel, 1.0f), b(numel, -2.0f), a1 = a, b1 = b;
  const tern::WeightedTarget targets[2] = {{0.5f, absl::MakeSpan(a)}, {-3.0f, absl::MakeSpan(b)}};
  const absl::Status each = decoder.DecodeAccumulateEach(view, targets);
  if (each.ok() != decoder.Validate(view).ok()) std::abort();
  if (each.ok() && (!decoder.DecodeAccumulate(view, 0.5f, absl::MakeSpan(a1)).ok() ||
                    !decoder.DecodeAccumulate(view, -3.0f, absl::MakeSpan(b1)).ok())) {
    std::abort();
  }
  if (numel > 0 && (std::memcmp(a.data(), a1.data(), 4 * a.size()) != 0 ||
                    std::memcmp(b.data(), b1.data(), 4 * b.size()) != 0)) {
    std::abort();
  }
  // The norm a receiver's guard measures: Validate's verdict.
  if (decoder.Norm(view).ok() != s.ok()) std::abort();
  std::vector<absl::string_view> pieces;
  for (size_t at = 0; at < size; at += cut) {
    pieces.emplace_back(reinterpret_cast<const char*>(data) + at, std::min(cut, size - at));
  }
  tern::EncodedView split = view;
  split.payload = {};
  split.pieces = pieces;
  std::vector<float> from_pieces(numel, 1.0f);
  const absl::Status p = accumulate
                             ? decoder.DecodeAccumulate(split, 0.5f, absl::MakeSpan(from_pieces))
                             : decoder.Decode(split, absl::MakeSpan(from_pieces));
  if (p.ok() != s.ok() || decoder.Validate(split).ok() != s.ok()) std::abort();
  if (s.ok() && numel > 0 && std::memcmp(out.data(), from_pieces.data(), 4 * numel) != 0) {
    std::abort();
  }
  // Several payloads summed at once (the payload in one place and in pieces) are each
  // DecodeAccumulate'd in turn: the same verdict, and where it decodes the same bits.
  const tern::EncodedView both[2] = {view, split};
  const float weights[2] = {0.5f, -3.0f};
  std::vector<float> many(numel, 1.0f), in_turn = many;
  const absl::Status m = decoder.DecodeAccumulateMany(both, weights, absl::MakeSpan(many));
  if (m.ok() != s.ok()) std::abort();
  if (m.ok() && (!decoder.DecodeAccumulate(view, 0.5f, absl::MakeSpan(in_turn)).ok() ||
                 !decoder.DecodeAccumulate(split, -3.0f, absl::MakeSpan(in_turn)).ok() ||
                 (numel > 0 && std::memcmp(many.data(), in_turn.data(), 4 * numel) != 0))) {
    std::abort();
  }
  return 0;
}
