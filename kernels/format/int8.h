// int8.v1's wire format (docs/wire-format.md §int8.v1), shared by the CPU codec
// (kernels/cpu/int8.cc) and the GPU codec (kernels/cuda/int8.cu): parameters, canonical spec,
// header. Payload: u32 block | u8 mode (0 absmax, 1 minmax) | numel code bytes; scales: one per
// block (absmax), or lo and step per block (minmax).
#ifndef TERN_KERNELS_FORMAT_INT8_H_
#define TERN_KERNELS_FORMAT_INT8_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec.h"
#include "kernels/codec.h"

namespace tern::format {

inline constexpr char kInt8Name[] = "int8.v1";
inline constexpr size_t kInt8HeaderBytes = 5;
inline constexpr uint8_t kInt8AbsMax = 0;
inline constexpr uint8_t kInt8MinMax = 1;

struct Int8Params {
  uint32_t block = 1024;  // [1, 2^20]
  bool minmax = false;
  bool stochastic = false;
  std::string Canonical() const;  // "block=1024,mode=absmax,round=nearest"
  std::string Spec() const;       // "int8:" + Canonical()
  size_t Blocks(size_t n) const { return (n + block - 1) / block; }
};
// block (default 1024), mode=absmax|minmax, round=nearest|stochastic.
absl::StatusOr<Int8Params> ParseInt8Params(SpecParams& p);

void WriteInt8Header(const Int8Params& p, uint8_t* out);  // kInt8HeaderBytes

struct Int8Header {
  uint32_t block = 0;
  bool minmax = false;
  size_t blocks = 0;
  const uint8_t* codes = nullptr;  // numel bytes, not yet checked (absmax refuses 0x80)
};
// Everything but the code bytes: header, sizes, scale count and values.
absl::StatusOr<Int8Header> ReadInt8Header(const EncodedView& in);

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_INT8_H_
