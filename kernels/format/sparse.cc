#include "kernels/format/sparse.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/status_macros.h"
#include "kernels/format/payload.h"

namespace tern::format {

size_t SparseK(double ratio, size_t d) {
  if (d == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(d));
  return std::clamp<size_t>(static_cast<size_t>(k), 1, d);
}

std::string TopKParams::Canonical() const { return absl::StrCat("ratio=", ratio); }
std::string TopKParams::Spec() const { return absl::StrCat("topk:", Canonical()); }
absl::StatusOr<TopKParams> ParseTopKParams(SpecParams& p) {
  TopKParams o;
  TERN_ASSIGN_OR_RETURN(o.ratio, p.Double("ratio", 0.01, 1e-9, 1.0));
  return o;
}

std::string ThresholdParams::Canonical() const { return absl::StrCat("tau=", tau); }
std::string ThresholdParams::Spec() const { return absl::StrCat("threshold:", Canonical()); }
absl::StatusOr<ThresholdParams> ParseThresholdParams(SpecParams& p) {
  TERN_ASSIGN_OR_RETURN(double tau, p.Double("tau", 1e-3, 0.0, 3.4e38));
  ThresholdParams o;
  o.tau = static_cast<float>(tau);
  return o;
}

std::string DgcParams::Canonical() const {
  return absl::StrCat("ratio=", ratio, ",sample=", sample);
}
std::string DgcParams::Spec() const { return absl::StrCat("dgc:", Canonical()); }
absl::StatusOr<DgcParams> ParseDgcParams(SpecParams& p) {
  DgcParams o;
  TERN_ASSIGN_OR_RETURN(o.ratio, p.Double("ratio", 0.001, 1e-9, 1.0));
  TERN_ASSIGN_OR_RETURN(o.sample, p.Double("sample", 0.01, 1e-6, 1.0));
  return o;
}

std::string DctParams::Canonical() const { return absl::StrCat("ratio=", ratio, ",every=", every); }
std::string DctParams::Spec() const { return absl::StrCat("dct:", Canonical()); }
absl::StatusOr<DctParams> ParseDctParams(SpecParams& p) {
  DctParams o;
  TERN_ASSIGN_OR_RETURN(o.ratio, p.Double("ratio", 0.01, 1e-9, 1.0));
  TERN_ASSIGN_OR_RETURN(int64_t every, p.Int("every", 10, 1, 1 << 20));
  o.every = static_cast<uint32_t>(every);
  return o;
}

absl::StatusOr<SparseHeader> ReadSparseHeader(absl::string_view codec, const EncodedView& in) {
  if (!in.scales.empty()) {
    return internal::PayloadError(codec, "expected no scales, got ", in.scales.size());
  }
  ByteReader r(in.payload.data(), in.payload.size());
  SparseHeader h;
  if (!r.U32(&h.k)) {
    return internal::PayloadError(codec, "truncated header (", in.payload.size(), " bytes)");
  }
  if (h.k > in.numel) {
    return internal::PayloadError(codec, "k = ", h.k, " exceeds numel = ", in.numel);
  }
  const uint64_t body = uint64_t{h.k} * 8;
  if (r.remaining() != body) {
    return internal::PayloadError(codec, "k = ", h.k, " needs ", body, " body bytes, got ",
                                  r.remaining());
  }
  h.indices = r.Take(4 * size_t{h.k});
  h.values = r.Take(4 * size_t{h.k});
  // Well-formed is not harmless: one NaN value would poison every model it is mixed into.
  if (absl::Status s = internal::CheckF32Values(codec, h.values, h.k); !s.ok()) return s;
  return h;
}

}  // namespace tern::format
