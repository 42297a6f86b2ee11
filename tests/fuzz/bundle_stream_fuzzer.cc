// libFuzzer target for the streaming bundle parser (common/bundle_stream.h) and the payload scans
// that watch it (kernels/payload_scans.h): the input's first byte picks the piece size (low six
// bits) and whether pieces come with owners, so that payloads of the cast codecs stay in place
// (top bit); the rest is a serialized TensorBundle (or anything). Every path ends in a bundle or
// an error status; a bundle it returns (in-place payloads joined) is exactly what protobuf's own
// parser makes of the same bytes, and a scanned payload gets Codec::Norm's verdict and norm, in
// one place and in its pieces (else it aborts: a difference is a bug).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "common/bundle_stream.h"
#include "kernels/builtin.h"
#include "kernels/payload_scans.h"
#include "kernels/wire.h"

namespace {

void CheckScans(const tern::CodecRegistry& codecs, const tern::PayloadScans& scans,
                const tern::ReceivedBundle& received) {
  const tern::v1::TensorBundle& bundle = received.bundle;
  for (int i = 0; i < bundle.tensors_size(); ++i) {
    tern::EncodedTensor t;
    t.codec = bundle.tensors(i).tensor().codec();
    t.numel = bundle.tensors(i).tensor().numel();
    t.scales.assign(bundle.tensors(i).tensor().scales().begin(),
                    bundle.tensors(i).tensor().scales().end());
    t.payload = bundle.tensors(i).tensor().payload();
    if (static_cast<size_t>(i) < received.in_place.size()) t.in_place = received.in_place[i];
    tern::PayloadScan* scan = scans.For(static_cast<size_t>(i), t);
    if (scan == nullptr) continue;
    const tern::EncodedView view = tern::EncodedView::Of(t);
    const absl::StatusOr<double> got = scan->Finish(view);
    const absl::StatusOr<double> want = codecs.Norm(view);
    tern::EncodedTensor flat = t;  // the same bytes in one place
    flat.payload = t.payload + t.in_place.Flatten();
    flat.in_place = {};
    const absl::StatusOr<double> want_flat = codecs.Norm(tern::EncodedView::Of(flat));
    const auto same = [](const absl::StatusOr<double>& a, const absl::StatusOr<double>& b) {
      return a.ok() == b.ok() && (!a.ok() || *a == *b || (std::isnan(*a) && std::isnan(*b)));
    };
    if (!same(got, want) || !same(want, want_flat)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto* codecs = tern::NewBuiltinCodecRegistry().release();
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  const bool owned = (data[0] & 0x80) != 0;
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  tern::PayloadScans scans(codecs);
  tern::BundleStreamParser parser(n, &scans, /*in_place_min_bytes=*/1);
  const auto owner = owned ? std::make_shared<int>(0) : nullptr;  // the input outlives the parse
  for (size_t at = 0; at < n; at += piece) {
    if (!parser.Feed(absl::string_view(bytes + at, std::min(piece, n - at)), owner).ok()) return 0;
  }
  absl::StatusOr<tern::ReceivedBundle> got = parser.FinishInPlace();
  if (!got.ok()) return 0;
  CheckScans(*codecs, scans, *got);
  tern::v1::TensorBundle joined = got->bundle;
  for (size_t i = 0; i < got->in_place.size(); ++i) {
    if (got->in_place[i].empty()) continue;
    if (!joined.tensors(static_cast<int>(i)).tensor().payload().empty()) std::abort();
    joined.mutable_tensors(static_cast<int>(i))
        ->mutable_tensor()
        ->set_payload(got->in_place[i].Flatten());
  }
  // Compared serialized: equal messages serialize alike, and NaN scales compare unequal.
  tern::v1::TensorBundle want;
  if (!want.ParseFromArray(bytes, static_cast<int>(n)) ||
      joined.SerializeAsString() != want.SerializeAsString()) {
    std::abort();
  }
  return 0;
}
