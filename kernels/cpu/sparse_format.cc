#include "kernels/cpu/sparse_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/byte_io.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/format/sparse.h"

namespace tern::internal {
namespace {

struct SparseView {
  uint32_t k = 0;
  const uint8_t* indices = nullptr;
  const uint8_t* values = nullptr;
};

absl::Status Parse(absl::string_view codec, const EncodedView& in, SparseView* v) {
  absl::StatusOr<format::SparseHeader> h = format::ReadSparseHeader(codec, in);
  if (!h.ok()) return h.status();
  v->k = h->k;
  v->indices = h->indices;
  v->values = h->values;
  int64_t prev = -1;
  for (uint32_t j = 0; j < v->k; ++j) {
    uint32_t idx;
    std::memcpy(&idx, v->indices + 4 * size_t{j}, 4);
    if (idx >= in.numel || static_cast<int64_t>(idx) <= prev) {
      return PayloadError(codec, "index ", idx, " at position ", j,
                          idx >= in.numel ? " is out of range" : " is not ascending");
    }
    prev = idx;
  }
  return absl::OkStatus();
}

}  // namespace

void WriteSparsePayloadValues(absl::Span<const uint32_t> idx, absl::Span<const float> values,
                              EncodedTensor* out) {
  const uint32_t k = static_cast<uint32_t>(idx.size());
  uint8_t* p = ResizePayload(&out->payload, 4 + 8 * size_t{k});
  std::memcpy(p, &k, 4);
  if (k == 0) return;  // (idx.data() may be null)
  std::memcpy(p + 4, idx.data(), 4 * size_t{k});
  std::memcpy(p + 4 + 4 * size_t{k}, values.data(), 4 * size_t{k});
}

absl::Status DecodeSparsePayload(absl::string_view codec, const EncodedView& in, float weight,
                                 bool accumulate, absl::Span<float> out) {
  SparseView v;
  if (absl::Status s = Parse(codec, in, &v); !s.ok()) return s;
  if (!accumulate) std::fill(out.begin(), out.end(), 0.0f);
  for (uint32_t j = 0; j < v.k; ++j) {
    uint32_t idx;
    float val;
    std::memcpy(&idx, v.indices + 4 * size_t{j}, 4);
    std::memcpy(&val, v.values + 4 * size_t{j}, 4);
    if (accumulate) {
      out[idx] += weight * val;
    } else {
      out[idx] = val;
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSparsePayload(absl::string_view codec, const EncodedView& in) {
  SparseView v;
  return Parse(codec, in, &v);
}

absl::StatusOr<double> SparsePayloadNorm(absl::string_view codec, const EncodedView& in) {
  SparseView v;
  if (absl::Status s = Parse(codec, in, &v); !s.ok()) return s;
  double sum = 0;
  for (uint32_t j = 0; j < v.k; ++j) {
    float val;
    std::memcpy(&val, v.values + 4 * size_t{j}, 4);
    sum += static_cast<double>(val) * val;
  }
  return std::sqrt(sum);
}

absl::Status ReadSparseIndices(absl::string_view codec, const EncodedView& in,
                               std::vector<uint32_t>* indices) {
  SparseView v;
  if (absl::Status s = Parse(codec, in, &v); !s.ok()) return s;
  indices->resize(v.k);
  if (v.k > 0) std::memcpy(indices->data(), v.indices, 4 * size_t{v.k});
  return absl::OkStatus();
}

absl::Status SparseCodec::Encode(absl::Span<const float> x, const EncodeOptions& options,
                                 EncodedTensor* out) {
  if (absl::Status s = CheckNumel(Name(), x.size()); !s.ok()) return s;
  Select(x, options.pool, &indices_, &values_);
  Write(x.size(), indices_, values_, out);
  return absl::OkStatus();
}

void SparseCodec::Write(uint64_t numel, absl::Span<const uint32_t> indices,
                        absl::Span<const float> values, EncodedTensor* out) const {
  SetHeader(*this, params_, numel, out);
  out->scales.clear();
  WriteSparsePayloadValues(indices, values, out);
}

}  // namespace tern::internal
