#include "kernels/codec.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/simd.h"
#include "kernels/view_check.h"

namespace tern {

absl::Status Codec::RestoreEncoderState(absl::string_view state) {
  if (state.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("codec ", Spec(), " keeps no encoder state; got ",
                                                 state.size(), " bytes of it"));
}

namespace internal {

absl::Status CheckView(absl::string_view codec, const EncodedView& in, size_t out_size) {
  if (in.codec != codec) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload of codec '", in.codec, "' given to decoder '", codec, "'"));
  }
  if (in.numel != out_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload holds ", in.numel, " elements but the output has ", out_size));
  }
  return CheckNumel(codec, out_size);
}

}  // namespace internal

EncodedView Codec::InOnePlace(const EncodedView& in, std::string* flat) const {
  if (in.pieces.empty() || ReadsPieces()) return in;
  flat->reserve(in.PayloadSize());
  flat->append(reinterpret_cast<const char*>(in.payload.data()), in.payload.size());
  for (absl::string_view p : in.pieces) flat->append(p.data(), p.size());
  EncodedView v = in;
  v.payload = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(flat->data()), flat->size());
  v.pieces = {};
  return v;
}

absl::Status Codec::Decode(const EncodedView& view, absl::Span<float> out, ThreadPool* pool) const {
  if (absl::Status s = internal::CheckView(Name(), view, out.size()); !s.ok()) return s;
  std::string flat;
  return DecodeImpl(InOnePlace(view, &flat), 1.0f, /*accumulate=*/false, out, pool);
}

absl::Status Codec::DecodeAccumulate(const EncodedView& view, float weight, absl::Span<float> out,
                                     ThreadPool* pool) const {
  if (absl::Status s = internal::CheckView(Name(), view, out.size()); !s.ok()) return s;
  std::string flat;
  return DecodeImpl(InOnePlace(view, &flat), weight, /*accumulate=*/true, out, pool);
}

absl::Status Codec::DecodeAccumulateEach(const EncodedView& view,
                                         absl::Span<const WeightedTarget> targets) const {
  for (const WeightedTarget& t : targets) {
    if (absl::Status s = internal::CheckView(Name(), view, t.out.size()); !s.ok()) return s;
  }
  std::string flat;
  return DecodeAccumulateEachImpl(InOnePlace(view, &flat), targets);
}

absl::Status Codec::DecodeAccumulateEachImpl(const EncodedView& in,
                                             absl::Span<const WeightedTarget> targets) const {
  for (const WeightedTarget& t : targets) {
    if (absl::Status s = DecodeImpl(in, t.weight, /*accumulate=*/true, t.out, nullptr); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Codec::DecodeAccumulateMany(absl::Span<const EncodedView> ins,
                                         absl::Span<const float> weights,
                                         absl::Span<float> out) const {
  if (weights.size() != ins.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": ", ins.size(), " payloads and ", weights.size(), " weights"));
  }
  std::vector<std::string> flats(ins.size());
  std::vector<EncodedView> views;
  views.reserve(ins.size());
  for (size_t j = 0; j < ins.size(); ++j) {
    if (absl::Status s = internal::CheckView(Name(), ins[j], out.size()); !s.ok()) return s;
    views.push_back(InOnePlace(ins[j], &flats[j]));
  }
  return DecodeAccumulateManyImpl(views, weights, out);
}

absl::Status Codec::DecodeAccumulateManyImpl(absl::Span<const EncodedView> ins,
                                             absl::Span<const float> weights,
                                             absl::Span<float> out) const {
  for (size_t j = 0; j < ins.size(); ++j) {
    if (absl::Status s = DecodeImpl(ins[j], weights[j], /*accumulate=*/true, out, nullptr);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Codec::EncodeSelection(const TopKSelection&, const EncodeOptions&, EncodedTensor*) {
  return absl::UnimplementedError(
      absl::StrCat(Name(), " encodes from its whole input, not from a top-k selection"));
}

absl::Status Codec::Validate(const EncodedView& view) const {
  if (absl::Status s = internal::CheckView(Name(), view, view.numel); !s.ok()) return s;
  std::string flat;
  return ValidateImpl(InOnePlace(view, &flat));
}

namespace {

// Reused per thread: a fresh buffer of the tensor's size per message costs more than the decode
// (page faults, zeroing).
absl::Span<float> Scratch(size_t n) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < n) scratch.resize(n);
  return absl::MakeSpan(scratch.data(), n);
}

}  // namespace

absl::StatusOr<double> Codec::Norm(const EncodedView& view) const {
  if (absl::Status s = internal::CheckView(Name(), view, view.numel); !s.ok()) return s;
  std::string flat;
  return NormImpl(InOnePlace(view, &flat));
}

absl::Status Codec::ValidateImpl(const EncodedView& in) const {
  return DecodeImpl(in, 1.0f, /*accumulate=*/false, Scratch(in.numel), nullptr);
}

absl::StatusOr<double> Codec::NormImpl(const EncodedView& in) const {
  const absl::Span<float> x = Scratch(in.numel);
  if (absl::Status s = DecodeImpl(in, 1.0f, /*accumulate=*/false, x, nullptr); !s.ok()) return s;
  return L2Norm(x);
}

namespace {

// Sixteen partial sums: four independent vectors of four doubles under AVX2, so the additions'
// latency does not bound the loop (a received dense message is checked by its norm: this pass
// was a tenth of a 64 MB push's CPU with four). `at(i)` is element i. The order is fixed in the
// source, so every instruction-set version, over floats or over little-endian words at any
// alignment, gives the same bits for the same values.
template <typename At>
inline double SumOfSquaresOf(size_t n, At at) {
  constexpr size_t kLanes = 16;
  double s[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const double v = at(i + j);
      s[j] += v * v;
    }
  }
  for (; i < n; ++i) {
    const double v = at(i);
    s[0] += v * v;
  }
  double total = 0;
  for (size_t j = 0; j < kLanes; ++j) total += s[j];
  return total;
}

TERN_MULTIVERSION double SumOfSquares(const float* x, size_t n) {
  return SumOfSquaresOf(n, [x](size_t i) { return x[i]; });
}

TERN_MULTIVERSION double SumOfSquaresOfWords(const uint8_t* words, size_t n) {
  return SumOfSquaresOf(n, [words](size_t i) {
    float v;
    std::memcpy(&v, words + 4 * i, 4);
    return v;
  });
}

}  // namespace

double SquaredL2Norm(absl::Span<const float> x) { return SumOfSquares(x.data(), x.size()); }

double SquaredL2NormOfWords(const uint8_t* words, size_t n) {
  static_assert(sizeof(float) == 4);
  return SumOfSquaresOfWords(words, n);
}

double L2Norm(absl::Span<const float> x) { return std::sqrt(SquaredL2Norm(x)); }

}  // namespace tern
