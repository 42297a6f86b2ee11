#include "kernels/cpu/randomk.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/format/randomk.h"
#include "kernels/format/sparse.h"

namespace tern {
namespace {

using Permutation = format::RandomKPermutation;

class RandomKCodec final : public Codec {
 public:
  explicit RandomKCodec(const format::RandomKParams& p) : format_(p), params_(p.Canonical()) {}
  absl::string_view Name() const override { return format::kRandomKName; }
  std::string Spec() const override { return format_.Spec(); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    const uint32_t k = static_cast<uint32_t>(format::SparseK(format_.ratio, x.size()));
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.clear();
    uint8_t* p =
        internal::ResizePayload(&out->payload, format::kRandomKHeaderBytes + 4 * size_t{k});
    format::WriteRandomKHeader(options.seed, k, p);
    const float scale = format_.unbiased ? static_cast<float>(double(x.size()) / k) : 1.0f;
    if (k == 0) return absl::OkStatus();
    const Permutation perm = Permutation::Make(options.seed, x.size());
    for (uint32_t j = 0; j < k; ++j) {
      const float v = x[perm(j)] * scale;
      std::memcpy(p + format::kRandomKHeaderBytes + 4 * size_t{j}, &v, 4);
    }
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool*) const override {
    TERN_ASSIGN_OR_RETURN(const format::RandomKHeader h, format::ReadRandomKHeader(in));
    const uint32_t k = h.k;
    TERN_RETURN_IF_ERROR(internal::CheckF32Values(Name(), h.values, k));
    if (!accumulate) std::fill(out.begin(), out.end(), 0.0f);
    if (k == 0) return absl::OkStatus();
    const Permutation perm = Permutation::Make(h.seed, in.numel);
    const uint8_t* values = h.values;
    for (uint32_t j = 0; j < k; ++j) {
      float v;
      std::memcpy(&v, values + 4 * size_t{j}, 4);
      const uint32_t idx = perm(j);
      if (accumulate) {
        out[idx] += weight * v;
      } else {
        out[idx] = v;
      }
    }
    return absl::OkStatus();
  }

 private:
  const format::RandomKParams format_;
  const std::string params_;
};

}  // namespace

uint32_t RandomKPosition(uint64_t seed, uint64_t d, uint32_t j) {
  return Permutation::Make(seed, d)(j);
}

absl::StatusOr<std::unique_ptr<Codec>> NewRandomKCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::RandomKParams p, format::ParseRandomKParams(params));
  return std::make_unique<RandomKCodec>(p);
}

}  // namespace tern
