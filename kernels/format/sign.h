// sign.v1's wire format (docs/wire-format.md §sign.v1), shared by kernels/cpu/sign.cc and
// kernels/cuda/sign.cu. Payload: u32 chunk | ceil(numel / 8) sign bytes (bit i = x_i < 0, LSB
// first, zero padding); scales: one mean |x| per chunk of `chunk` elements.
#ifndef TERN_KERNELS_FORMAT_SIGN_H_
#define TERN_KERNELS_FORMAT_SIGN_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern::format {

inline constexpr char kSignName[] = "sign.v1";
inline constexpr size_t kSignHeaderBytes = 4;

struct SignParams {
  uint32_t chunk = 1024;  // a multiple of 8 in [8, 2^30]
  std::string Canonical() const;
  std::string Spec() const;
  size_t Chunks(size_t n) const { return (n + chunk - 1) / chunk; }
};
absl::StatusOr<SignParams> ParseSignParams(SpecParams& p);

void WriteSignHeader(const SignParams& p, uint8_t* out);  // kSignHeaderBytes

struct SignHeader {
  uint32_t chunk = 0;
  size_t chunks = 0;
  const uint8_t* bits = nullptr;  // ceil(numel / 8) bytes, padding checked
};
// The whole payload: header, sizes, scales, zero padding.
absl::StatusOr<SignHeader> ReadSignHeader(const EncodedView& in);

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_SIGN_H_
