#include "kernels/codec.h"

#include <cmath>
#include <vector>

#include "kernels/format/payload.h"

namespace tern {
absl::Status Codec::Decode(const EncodedView& in, absl::Span<float> out, ThreadPool* pool) const {
  if (absl::Status s = internal::CheckView(Name(), in, out.size()); !s.ok()) return s;
  return DecodeImpl(in, 1.0f, /*accumulate=*/false, out, pool);
}

absl::Status Codec::DecodeAccumulate(const EncodedView& in, float weight, absl::Span<float> out,
                                     ThreadPool* pool) const {
  if (absl::Status s = internal::CheckView(Name(), in, out.size()); !s.ok()) return s;
  return DecodeImpl(in, weight, /*accumulate=*/true, out, pool);
}

absl::Status Codec::Validate(const EncodedView& in) const {
  if (absl::Status s = internal::CheckView(Name(), in, in.numel); !s.ok()) return s;
  return ValidateImpl(in);
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

absl::StatusOr<double> Codec::Norm(const EncodedView& in) const {
  if (absl::Status s = internal::CheckView(Name(), in, in.numel); !s.ok()) return s;
  return NormImpl(in);
}

absl::Status Codec::ValidateImpl(const EncodedView& in) const {
  return DecodeImpl(in, 1.0f, /*accumulate=*/false, Scratch(in.numel), nullptr);
}

absl::StatusOr<double> Codec::NormImpl(const EncodedView& in) const {
  const absl::Span<float> x = Scratch(in.numel);
  if (absl::Status s = DecodeImpl(in, 1.0f, /*accumulate=*/false, x, nullptr); !s.ok()) return s;
  return L2Norm(x);
}

double SquaredL2Norm(absl::Span<const float> x) {
  double s[4] = {0, 0, 0, 0};  // four partial sums: vectorizes
  size_t i = 0;
  for (; i + 4 <= x.size(); i += 4) {
    for (int j = 0; j < 4; ++j) s[j] += static_cast<double>(x[i + j]) * x[i + j];
  }
  for (; i < x.size(); ++i) s[0] += static_cast<double>(x[i]) * x[i];
  return s[0] + s[1] + s[2] + s[3];
}

double L2Norm(absl::Span<const float> x) { return std::sqrt(SquaredL2Norm(x)); }

}  // namespace tern
