#include "kernels/wire.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tern {

void ToProto(EncodedTensor&& t, v1::EncodedTensor* msg) {
  msg->set_codec(std::move(t.codec));
  msg->set_params(std::move(t.params));
  msg->set_numel(t.numel);
  msg->mutable_scales()->Assign(t.scales.begin(), t.scales.end());
  if (t.in_place.empty()) {
    msg->set_payload(std::move(t.payload));
  } else {
    msg->set_payload(t.in_place.Flatten());  // a received payload sent on: it needs its bytes
  }
}

absl::StatusOr<EncodedView> ViewOf(const v1::EncodedTensor& msg) {
  if (msg.shape_size() > 0) {
    uint64_t prod = 1;
    for (int64_t d : msg.shape()) {
      if (d < 0 || (d > 0 && prod > UINT64_MAX / static_cast<uint64_t>(d))) {
        return absl::InvalidArgumentError("tensor shape has a negative or overflowing dimension");
      }
      prod *= static_cast<uint64_t>(d);
    }
    if (prod != msg.numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor shape holds ", prod, " elements but numel is ", msg.numel()));
    }
  }
  return EncodedView{
      msg.codec(),
      msg.numel(),
      absl::Span<const float>(msg.scales().data(), msg.scales_size()),
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(msg.payload().data()),
                                msg.payload().size()),
      {}};
}

absl::Status DecodeMessage(const CodecRegistry& registry, const v1::EncodedTensor& msg,
                           absl::Span<float> out) {
  TERN_ASSIGN_OR_RETURN(EncodedView view, ViewOf(msg));
  return registry.Decode(view, out);
}

absl::Status DecodeAccumulateMessage(const CodecRegistry& registry, const v1::EncodedTensor& msg,
                                     float weight, absl::Span<float> out) {
  TERN_ASSIGN_OR_RETURN(EncodedView view, ViewOf(msg));
  return registry.DecodeAccumulate(view, weight, out);
}

}  // namespace tern
