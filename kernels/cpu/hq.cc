#include "kernels/cpu/hq.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bit_io.h"
#include "common/byte_io.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/cpu/stc.h"
#include "kernels/format/hq.h"
#include "kernels/format/payload.h"
#include "kernels/format/sparse.h"
#include "kernels/select.h"

namespace tern {
namespace {

class HqCodec final : public Codec {
 public:
  explicit HqCodec(format::HqParams p) : p_(std::move(p)), params_(p_.Canonical()) {}
  absl::string_view Name() const override { return format::kHqName; }
  std::string Spec() const override { return p_.Spec(); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    const size_t n = x.size();
    const size_t k = format::SparseK(p_.ratio, n);
    const bool every = k == n;
    if (every) {
      values_.assign(x.begin(), x.end());
      indices_.clear();
    } else {
      SelectTopK(x, k, &indices_, options.pool, &values_);
    }
    for (float v : values_) {
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(Name(), ": cannot encode a non-finite value (", v, ")"));
      }
    }
    const int tiers = p_.tiers();
    // Tier cuts at the magnitudes' quantiles, each tier twice the count of the one above it
    // (tier j holds 2^j / (2^L - 1) of the selection): cut[j - 1] is the least magnitude of the
    // top tiers 0..j - 1, so tier(m) is the number of cuts above m.
    mags_.resize(k);
    for (size_t j = 0; j < k; ++j) mags_[j] = std::fabs(values_[j]);
    std::vector<float> cut;
    if (k > 0) {
      sorted_ = mags_;
      const uint64_t whole = (uint64_t{1} << tiers) - 1;
      for (int j = 1; j < tiers; ++j) {
        const size_t rank = std::max<size_t>(1, k * ((uint64_t{1} << j) - 1) / whole);
        // The rank-th largest (0-based rank - 1): the least of the top `rank`.
        std::nth_element(sorted_.begin(), sorted_.begin() + static_cast<ptrdiff_t>(rank - 1),
                         sorted_.end(), std::greater<float>());
        cut.push_back(sorted_[rank - 1]);
      }
    }
    const auto tier_of = [&](float m) {
      int t = 0;
      for (float c : cut) t += m < c ? 1 : 0;
      return t;
    };
    std::vector<float> lo(tiers, INFINITY), hi(tiers, 0.0f);
    tier_.resize(k);
    for (size_t j = 0; j < k; ++j) {
      const int t = tier_of(mags_[j]);
      tier_[j] = static_cast<uint8_t>(t);
      lo[t] = std::min(lo[t], mags_[j]);
      hi[t] = std::max(hi[t], mags_[j]);
    }
    internal::SetHeader(*this, params_, n, out);
    out->scales.resize(2 * static_cast<size_t>(tiers));
    for (int t = 0; t < tiers; ++t) {
      if (lo[t] > hi[t]) lo[t] = hi[t] = 0;  // an empty tier
      out->scales[2 * t] = lo[t];
      out->scales[2 * t + 1] = hi[t];
    }
    out->payload.clear();
    ByteWriter header(&out->payload);
    header.U32(static_cast<uint32_t>(k));
    header.U8(static_cast<uint8_t>(tiers));
    for (int b : p_.bits) header.U8(static_cast<uint8_t>(b));
    const int rice = every ? 0 : StcGolombBits(k, n);
    header.U8(every ? format::kHqEveryPosition : static_cast<uint8_t>(rice));
    const int tier_bits = format::HqTierBits(tiers);
    const RngKey key = MakeRngKey(options.seed, 0x4851);
    BitWriter bits(&out->payload);
    int64_t prev = -1;
    for (size_t j = 0; j < k; ++j) {
      const uint32_t i = every ? static_cast<uint32_t>(j) : indices_[j];
      if (!every) bits.WriteRice(static_cast<uint64_t>(i - prev - 1), rice);
      prev = i;
      const int t = tier_[j];
      const int b = p_.bits[t];
      const float step = format::HqStep(lo[t], hi[t], b);
      uint32_t code = 0;
      if (step > 0) {
        // Stochastic rounding between the two grid points around the magnitude: unbiased.
        const float pos = (mags_[j] - lo[t]) / step;
        const float floor = std::floor(pos);
        code = static_cast<uint32_t>(floor);
        if (Uniform01(key, i) < pos - floor) ++code;
        code = std::min(code, format::HqMaxCode(b));
      }
      if (tier_bits > 0) bits.Write(static_cast<uint64_t>(t), tier_bits);
      bits.Write(values_[j] < 0 ? 1 : 0, 1);
      bits.Write(code, b - 1);
    }
    bits.Finish();
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool*) const override {
    thread_local std::vector<uint32_t> pos;
    thread_local std::vector<float> val;
    TERN_RETURN_IF_ERROR(Parse(in, &pos, &val));
    if (!accumulate) std::fill(out.begin(), out.end(), 0.0f);
    for (size_t j = 0; j < pos.size(); ++j) {
      if (accumulate) {
        out[pos[j]] += weight * val[j];
      } else {
        out[pos[j]] = val[j];
      }
    }
    return absl::OkStatus();
  }
  absl::Status ValidateImpl(const EncodedView& in) const override {
    thread_local std::vector<uint32_t> pos;
    thread_local std::vector<float> val;
    return Parse(in, &pos, &val);
  }
  absl::StatusOr<double> NormImpl(const EncodedView& in) const override {
    thread_local std::vector<uint32_t> pos;
    thread_local std::vector<float> val;
    TERN_RETURN_IF_ERROR(Parse(in, &pos, &val));
    return std::sqrt(SquaredL2Norm(val));
  }

 private:
  // The selected elements' positions (ascending, in range) and decoded values; every error a
  // decode reports.
  absl::Status Parse(const EncodedView& in, std::vector<uint32_t>* pos,
                     std::vector<float>* val) const {
    TERN_ASSIGN_OR_RETURN(format::HqHeader h, format::ReadHqHeader(in));
    const int tiers = static_cast<int>(h.bits.size());
    const int tier_bits = format::HqTierBits(tiers);
    const bool every = h.rice == format::kHqEveryPosition;
    pos->resize(h.k);
    val->resize(h.k);
    BitReader bits(h.stream, h.stream_bytes);
    const uint64_t max_quotient = every ? 0 : (in.numel >> h.rice) + 1;
    uint64_t next = 0;  // the least position the next element may take
    for (uint32_t j = 0; j < h.k; ++j) {
      uint64_t p = j;
      if (!every) {
        uint64_t gap = 0;
        if (!bits.ReadRice(h.rice, max_quotient, &gap)) {
          return internal::PayloadError(Name(), "bitstream ends or is malformed at element ", j);
        }
        p = next + gap;
        if (p >= in.numel) {
          return internal::PayloadError(Name(), "position ", p, " out of range at element ", j);
        }
        next = p + 1;
      }
      uint64_t t = 0, sign = 0, code = 0;
      if ((tier_bits > 0 && !bits.Read(tier_bits, &t)) || !bits.Read(1, &sign)) {
        return internal::PayloadError(Name(), "bitstream ends at element ", j);
      }
      if (t >= static_cast<uint64_t>(tiers)) {
        return internal::PayloadError(Name(), "tier ", t, " of ", tiers, " at element ", j);
      }
      const int b = h.bits[t];
      if (!bits.Read(b - 1, &code)) {
        return internal::PayloadError(Name(), "bitstream ends at element ", j);
      }
      const float lo = in.scales[2 * t], hi = in.scales[2 * t + 1];
      // Within [lo, hi]: codes are at most the top level by their width.
      const float m = std::min(hi, lo + static_cast<float>(code) * format::HqStep(lo, hi, b));
      (*pos)[j] = static_cast<uint32_t>(p);
      (*val)[j] = sign != 0 ? -m : m;
    }
    if (!bits.AtCanonicalEnd()) {
      return internal::PayloadError(Name(), "trailing bits after ", h.k, " elements");
    }
    return absl::OkStatus();
  }

  const format::HqParams p_;
  const std::string params_;
  std::vector<uint32_t> indices_;
  std::vector<float> values_, mags_, sorted_;
  std::vector<uint8_t> tier_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewHqCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::HqParams p, format::ParseHqParams(params));
  return std::make_unique<HqCodec>(std::move(p));
}

}  // namespace tern
