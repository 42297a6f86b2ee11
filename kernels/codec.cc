#include "kernels/codec.h"

#include "absl/strings/str_cat.h"

namespace tern {
namespace {

absl::Status CheckHeader(const Codec& codec, const EncodedView& in, size_t out_size) {
  if (in.codec != codec.Name()) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload of codec '", in.codec, "' given to decoder '", codec.Name(), "'"));
  }
  if (in.numel != out_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload holds ", in.numel, " elements but the output has ", out_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Codec::Decode(const EncodedView& in, absl::Span<float> out, ThreadPool* pool) const {
  if (absl::Status s = CheckHeader(*this, in, out.size()); !s.ok()) return s;
  return DecodeImpl(in, 1.0f, /*accumulate=*/false, out, pool);
}

absl::Status Codec::DecodeAccumulate(const EncodedView& in, float weight, absl::Span<float> out,
                                     ThreadPool* pool) const {
  if (absl::Status s = CheckHeader(*this, in, out.size()); !s.ok()) return s;
  return DecodeImpl(in, weight, /*accumulate=*/true, out, pool);
}

}  // namespace tern
