#include "kernels/cpu/randomk.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/cpu/topk.h"

namespace tern {
namespace {

constexpr size_t kHeaderBytes = 12;  // u64 seed | u32 k

// A 4-round Feistel network over 2h bits, h = max(1, ceil(log2(d)) / 2 rounded up), walked until
// the result falls in [0, d) (cycle walking keeps it a permutation of [0, d)).
struct Permutation {
  Permutation(uint64_t seed, uint64_t d) : key(MakeRngKey(seed, /*stream=*/0x52414e44)), d(d) {
    int bits = d <= 1 ? 2 : std::bit_width(d - 1);
    bits += bits & 1;
    half = bits / 2;
    mask = (uint32_t{1} << half) - 1;
  }
  uint32_t Round(uint32_t x) const {
    uint32_t l = x >> half, r = x & mask;
    for (uint32_t round = 0; round < 4; ++round) {
      const uint32_t f = Random32(key, (uint64_t{round} << 32) | r) & mask;
      const uint32_t nl = r;
      r = l ^ f;
      l = nl;
    }
    return (l << half) | r;
  }
  uint32_t operator()(uint32_t j) const {
    uint64_t x = j;
    do {
      x = Round(static_cast<uint32_t>(x));
    } while (x >= d);
    return static_cast<uint32_t>(x);
  }
  RngKey key;
  uint64_t d;
  int half;
  uint32_t mask;
};

class RandomKCodec final : public Codec {
 public:
  RandomKCodec(double ratio, bool unbiased)
      : ratio_(ratio),
        unbiased_(unbiased),
        params_(absl::StrCat("ratio=", ratio, ",unbiased=", unbiased ? 1 : 0)) {}
  absl::string_view Name() const override { return "randomk.v1"; }
  std::string Spec() const override { return absl::StrCat("randomk:", params_); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    const uint32_t k = static_cast<uint32_t>(SparseK(ratio_, x.size()));
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.clear();
    uint8_t* p = internal::ResizePayload(&out->payload, kHeaderBytes + 4 * size_t{k});
    std::memcpy(p, &options.seed, 8);
    std::memcpy(p + 8, &k, 4);
    const float scale = unbiased_ ? static_cast<float>(double(x.size()) / k) : 1.0f;
    if (k == 0) return absl::OkStatus();
    const Permutation perm(options.seed, x.size());
    for (uint32_t j = 0; j < k; ++j) {
      const float v = x[perm(j)] * scale;
      std::memcpy(p + kHeaderBytes + 4 * size_t{j}, &v, 4);
    }
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool*) const override {
    if (!in.scales.empty()) return internal::PayloadError(Name(), "expected no scales");
    ByteReader r(in.payload.data(), in.payload.size());
    uint64_t seed;
    uint32_t k;
    if (!r.U64(&seed) || !r.U32(&k)) return internal::PayloadError(Name(), "truncated header");
    if (k > in.numel) return internal::PayloadError(Name(), "k = ", k, " exceeds ", in.numel);
    if (r.remaining() != 4 * uint64_t{k}) {
      return internal::PayloadError(Name(), "k = ", k, " needs ", 4 * uint64_t{k},
                                    " value bytes, got ", r.remaining());
    }
    if (!accumulate) std::fill(out.begin(), out.end(), 0.0f);
    if (k == 0) return absl::OkStatus();
    const Permutation perm(seed, in.numel);
    const uint8_t* values = r.ptr();
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
  const double ratio_;
  const bool unbiased_;
  const std::string params_;
};

}  // namespace

uint32_t RandomKPosition(uint64_t seed, uint64_t d, uint32_t j) { return Permutation(seed, d)(j); }

absl::StatusOr<std::unique_ptr<Codec>> NewRandomKCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(double ratio, params.Double("ratio", 0.01, 1e-9, 1.0));
  TERN_ASSIGN_OR_RETURN(bool unbiased, params.Bool("unbiased", false));
  return std::make_unique<RandomKCodec>(ratio, unbiased);
}

}  // namespace tern
