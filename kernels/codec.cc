#include "kernels/codec.h"

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

}  // namespace tern
