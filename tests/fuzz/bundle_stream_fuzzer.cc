// libFuzzer target for the streaming bundle parser (common/bundle_stream.h): the input's first
// byte picks the piece size, the rest is a serialized TensorBundle (or anything). Every path ends
// in a bundle or an error status, and a bundle it returns is exactly what protobuf's own parser
// makes of the same bytes (else it aborts: a difference is a bug).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/bundle_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  tern::BundleStreamParser parser(n);
  for (size_t at = 0; at < n; at += piece) {
    if (!parser.Feed(absl::string_view(bytes + at, std::min(piece, n - at))).ok()) return 0;
  }
  absl::StatusOr<tern::v1::TensorBundle> got = parser.Finish();
  if (!got.ok()) return 0;
  tern::v1::TensorBundle want;
  // Compared serialized: equal messages serialize alike, and NaN scales compare unequal.
  if (!want.ParseFromArray(bytes, static_cast<int>(n)) ||
      got->SerializeAsString() != want.SerializeAsString()) {
    std::abort();
  }
  return 0;
}
