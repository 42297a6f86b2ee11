// libFuzzer target for the streaming bundle parser (common/bundle_stream.h) and the payload scans
// that watch it (kernels/payload_scans.h): the input's first byte picks the piece size, the rest
// is a serialized TensorBundle (or anything). Every path ends in a bundle or an error status; a
// bundle it returns is exactly what protobuf's own parser makes of the same bytes, and a scanned
// payload gets Codec::Norm's verdict and norm (else it aborts: a difference is a bug).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/bundle_stream.h"
#include "kernels/builtin.h"
#include "kernels/payload_scans.h"
#include "kernels/wire.h"

namespace {

void CheckScans(const tern::CodecRegistry& codecs, const tern::PayloadScans& scans,
                const tern::v1::TensorBundle& bundle) {
  for (int i = 0; i < bundle.tensors_size(); ++i) {
    tern::EncodedTensor t;
    t.codec = bundle.tensors(i).tensor().codec();
    t.numel = bundle.tensors(i).tensor().numel();
    t.scales.assign(bundle.tensors(i).tensor().scales().begin(),
                    bundle.tensors(i).tensor().scales().end());
    t.payload = bundle.tensors(i).tensor().payload();
    tern::PayloadScan* scan = scans.For(static_cast<size_t>(i), t);
    if (scan == nullptr) continue;
    const tern::EncodedView view = tern::EncodedView::Of(t);
    const absl::StatusOr<double> got = scan->Finish(view);
    const absl::StatusOr<double> want = codecs.Norm(view);
    if (got.ok() != want.ok() || (got.ok() && !(*got == *want || (std::isnan(*got) &&
                                                                  std::isnan(*want))))) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto* codecs = tern::NewBuiltinCodecRegistry().release();
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  tern::PayloadScans scans(codecs);
  tern::BundleStreamParser parser(n, &scans);
  for (size_t at = 0; at < n; at += piece) {
    if (!parser.Feed(absl::string_view(bytes + at, std::min(piece, n - at))).ok()) return 0;
  }
  absl::StatusOr<tern::v1::TensorBundle> got = parser.Finish();
  if (!got.ok()) return 0;
  // Compared serialized: equal messages serialize alike, and NaN scales compare unequal.
  tern::v1::TensorBundle want;
  if (!want.ParseFromArray(bytes, static_cast<int>(n)) ||
      got->SerializeAsString() != want.SerializeAsString()) {
    std::abort();
  }
  CheckScans(*codecs, scans, *got);
  return 0;
}
