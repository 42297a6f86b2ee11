#include "kernels/cpu/powersgd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"

namespace tern {
namespace powersgd {

void MatMul(absl::Span<const float> m, absl::Span<const float> q, size_t rows, size_t cols,
            size_t r, absl::Span<float> p) {
  for (size_t i = 0; i < rows; ++i) {
    float acc[256] = {};
    const float* mi = m.data() + i * cols;
    for (size_t j = 0; j < cols; ++j) {
      const float* qj = q.data() + j * r;
      for (size_t c = 0; c < r; ++c) acc[c] += mi[j] * qj[c];
    }
    std::memcpy(p.data() + i * r, acc, r * sizeof(float));
  }
}

void MatMulT(absl::Span<const float> m, absl::Span<const float> p, size_t rows, size_t cols,
             size_t r, absl::Span<float> q) {
  std::fill(q.begin(), q.end(), 0.0f);
  for (size_t i = 0; i < rows; ++i) {
    const float* mi = m.data() + i * cols;
    const float* pi = p.data() + i * r;
    for (size_t j = 0; j < cols; ++j) {
      float* qj = q.data() + j * r;
      for (size_t c = 0; c < r; ++c) qj[c] += mi[j] * pi[c];
    }
  }
}

void Orthogonalize(absl::Span<float> p, size_t rows, size_t r) {
  for (size_t c = 0; c < r; ++c) {
    for (size_t prev = 0; prev < c; ++prev) {
      double dot = 0;
      for (size_t i = 0; i < rows; ++i) dot += double{p[i * r + c]} * p[i * r + prev];
      for (size_t i = 0; i < rows; ++i) p[i * r + c] -= static_cast<float>(dot) * p[i * r + prev];
    }
    double norm = 0;
    for (size_t i = 0; i < rows; ++i) norm += double{p[i * r + c]} * p[i * r + c];
    norm = std::sqrt(norm);
    // A zero column (rank-deficient M) stays zero rather than dividing by ~0.
    const float inv = norm > 1e-30 ? static_cast<float>(1.0 / norm) : 0.0f;
    for (size_t i = 0; i < rows; ++i) p[i * r + c] *= inv;
  }
}

}  // namespace powersgd

namespace {

constexpr size_t kHeaderBytes = 12;  // u32 rows | u32 cols | u32 rank
constexpr uint32_t kMaxRank = 256;
constexpr float kMaxFactor = 1e18f;  // |P|, |Q| entries a payload may hold

class PowerSgdCodec final : public Codec {
 public:
  explicit PowerSgdCodec(uint32_t rank) : rank_(rank), params_(absl::StrCat("rank=", rank)) {}
  absl::string_view Name() const override { return "powersgd.v1"; }
  std::string Spec() const override { return absl::StrCat("powersgd:", params_); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    size_t rows = 1;
    if (!options.shape.empty()) {
      uint64_t prod = 1;
      for (int64_t s : options.shape) {
        if (s < 0) return absl::InvalidArgumentError("powersgd: negative dimension in shape");
        prod *= static_cast<uint64_t>(s);
      }
      if (prod != x.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("powersgd: shape holds ", prod, " elements, tensor has ", x.size()));
      }
      rows = x.empty() ? 0 : static_cast<size_t>(options.shape[0]);
    }
    const size_t cols = rows == 0 ? 0 : x.size() / rows;
    const size_t r = std::min<size_t>({rank_, rows, cols});
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.clear();
    uint8_t* p8 = internal::ResizePayload(&out->payload, kHeaderBytes + 4 * (rows + cols) * r);
    const uint32_t header[3] = {static_cast<uint32_t>(rows), static_cast<uint32_t>(cols),
                                static_cast<uint32_t>(r)};
    std::memcpy(p8, header, sizeof(header));
    if (r == 0) return absl::OkStatus();
    if (q_.size() != cols * r || rows_ != rows) {
      // (Re)start: Q from counter-based normal draws, so runs are reproducible.
      rows_ = rows;
      q_.resize(cols * r);
      const RngKey key = MakeRngKey(options.seed, /*stream=*/0x50535144);
      for (size_t i = 0; i < q_.size(); ++i) q_[i] = Normal(key, i);
    }
    p_.resize(rows * r);
    powersgd::MatMul(x, q_, rows, cols, r, absl::MakeSpan(p_));
    powersgd::Orthogonalize(absl::MakeSpan(p_), rows, r);
    powersgd::MatMulT(x, p_, rows, cols, r, absl::MakeSpan(q_));  // also the next warm start
    std::memcpy(p8 + kHeaderBytes, p_.data(), 4 * p_.size());
    std::memcpy(p8 + kHeaderBytes + 4 * p_.size(), q_.data(), 4 * q_.size());
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool*) const override {
    if (!in.scales.empty()) return internal::PayloadError(Name(), "expected no scales");
    ByteReader rd(in.payload.data(), in.payload.size());
    uint32_t rows, cols, r;
    if (!rd.U32(&rows) || !rd.U32(&cols) || !rd.U32(&r)) {
      return internal::PayloadError(Name(), "truncated header");
    }
    if (uint64_t{rows} * cols != in.numel) {
      return internal::PayloadError(Name(), rows, " x ", cols, " != numel ", in.numel);
    }
    if (r > std::min({rows, cols, kMaxRank})) {
      return internal::PayloadError(Name(), "rank ", r, " exceeds min(rows, cols, 256)");
    }
    const uint64_t want = 4 * (uint64_t{rows} + cols) * r;
    if (rd.remaining() != want) {
      return internal::PayloadError(Name(), "expected ", want, " factor bytes, got ",
                                    rd.remaining());
    }
    // Bounded factors keep every sum of r <= 256 products finite (256 * 1e18^2 < FLT_MAX); an
    // orthonormal P has entries <= 1, so only a hostile payload comes near.
    TERN_RETURN_IF_ERROR(
        internal::CheckF32Values(Name(), rd.ptr(), (size_t{rows} + cols) * r, kMaxFactor));
    std::vector<float> p(size_t{rows} * r), q(size_t{cols} * r);
    if (r > 0) {  // memcpy from/to the empty vectors' null data() would be UB
      std::memcpy(p.data(), rd.ptr(), 4 * p.size());
      std::memcpy(q.data(), rd.ptr() + 4 * p.size(), 4 * q.size());
    }
    for (size_t i = 0; i < rows; ++i) {
      const float* pi = p.data() + i * r;
      float* o = out.data() + i * cols;
      for (size_t j = 0; j < cols; ++j) {
        const float* qj = q.data() + j * r;
        float v = 0;
        for (size_t c = 0; c < r; ++c) v += pi[c] * qj[c];
        if (accumulate) {
          o[j] += weight * v;
        } else {
          o[j] = v;
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  const uint32_t rank_;
  const std::string params_;
  size_t rows_ = 0;
  std::vector<float> q_;  // warm start, cols x r
  std::vector<float> p_;  // scratch, rows x r
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewPowerSgdCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(int64_t rank, params.Int("rank", 4, 1, kMaxRank));
  return std::make_unique<PowerSgdCodec>(static_cast<uint32_t>(rank));
}

}  // namespace tern
