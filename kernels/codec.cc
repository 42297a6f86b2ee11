#include "kernels/codec.h"

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

absl::Status Codec::ValidateImpl(const EncodedView& in) const {
  // Reused per thread: a fresh buffer of the tensor's size per message costs more than the
  // decode (page faults, zeroing).
  thread_local std::vector<float> scratch;
  if (scratch.size() < in.numel) scratch.resize(in.numel);
  return DecodeImpl(in, 1.0f, /*accumulate=*/false, absl::MakeSpan(scratch.data(), in.numel),
                    nullptr);
}

}  // namespace tern
