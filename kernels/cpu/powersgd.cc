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

constexpr uint32_t kMaxRank = 256;
constexpr float kMaxValue = 1e18f;  // |P|, |Q| and raw entries a payload may hold
// PyTorch's min_compression_rate: a block is factored only when that shrinks it at least 2x;
// otherwise (biases, small or thin matrices) it goes raw, as the hook sends 1-D tensors.
constexpr uint64_t kMinCompressionRate = 2;

// A block as the payload describes it.
struct Block {
  uint32_t rows = 0, cols = 0, rank = 0;  // rank 0: raw values
  uint64_t Floats() const {
    return rank > 0 ? (uint64_t{rows} + cols) * rank : uint64_t{rows} * cols;
  }
};

// The rank a [rows, cols] block is sent at (0: raw).
uint32_t RankFor(uint64_t rows, uint64_t cols, uint32_t max_rank) {
  const uint64_t r = std::min<uint64_t>({max_rank, rows, cols});
  if (r == 0 || rows * cols < kMinCompressionRate * (rows + cols) * r) return 0;
  return static_cast<uint32_t>(r);
}

// The blocks to encode `numel` values as: options.blocks, or one of options.shape ([d] without).
absl::StatusOr<std::vector<Block>> PlanBlocks(uint64_t numel, const EncodeOptions& options,
                                              uint32_t max_rank) {
  std::vector<TensorBlock> given(options.blocks.begin(), options.blocks.end());
  if (given.empty()) {
    uint64_t rows = numel;
    if (!options.shape.empty()) {
      uint64_t prod = 1;
      for (int64_t s : options.shape) {
        if (s < 0) return absl::InvalidArgumentError("powersgd: negative dimension in shape");
        prod *= static_cast<uint64_t>(s);
      }
      if (prod != numel) {
        return absl::InvalidArgumentError(
            absl::StrCat("powersgd: shape holds ", prod, " elements, tensor has ", numel));
      }
      rows = static_cast<uint64_t>(options.shape[0]);
    }
    if (numel > 0) given.push_back({numel, rows});
  }
  std::vector<Block> blocks;
  uint64_t total = 0;
  for (const TensorBlock& b : given) {
    if (b.numel == 0 || b.rows == 0 || b.numel % b.rows != 0 || b.numel > UINT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("powersgd: a block of ", b.numel,
                                                     " elements cannot have ", b.rows, " rows"));
    }
    const uint64_t cols = b.numel / b.rows;
    blocks.push_back({static_cast<uint32_t>(b.rows), static_cast<uint32_t>(cols),
                      RankFor(b.rows, cols, max_rank)});
    total += b.numel;
  }
  if (total != numel) {
    return absl::InvalidArgumentError(
        absl::StrCat("powersgd: blocks hold ", total, " elements, the input has ", numel));
  }
  return blocks;
}

class PowerSgdCodec final : public Codec {
 public:
  explicit PowerSgdCodec(uint32_t rank) : rank_(rank), params_(absl::StrCat("rank=", rank)) {}
  absl::string_view Name() const override { return "powersgd.v2"; }
  std::string Spec() const override { return absl::StrCat("powersgd:", params_); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    TERN_ASSIGN_OR_RETURN(std::vector<Block> blocks, PlanBlocks(x.size(), options, rank_));
    if (warm_.size() != blocks.size()) warm_.assign(blocks.size(), {});
    uint64_t floats = 0;
    for (const Block& b : blocks) floats += b.Floats();
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.clear();
    uint8_t* p8 = internal::ResizePayload(&out->payload, 4 + 12 * blocks.size() + 4 * floats);
    const uint32_t n = static_cast<uint32_t>(blocks.size());
    std::memcpy(p8, &n, 4);
    uint8_t* head = p8 + 4;
    uint8_t* body = head + 12 * blocks.size();
    size_t offset = 0;
    for (size_t k = 0; k < blocks.size(); ++k) {
      const Block& b = blocks[k];
      const uint32_t h[3] = {b.rows, b.cols, b.rank};
      std::memcpy(head + 12 * k, h, 12);
      const absl::Span<const float> m = x.subspan(offset, uint64_t{b.rows} * b.cols);
      if (b.rank == 0) {
        std::memcpy(body, m.data(), 4 * m.size());
      } else {
        EncodeBlock(m, b, options.seed + k, &warm_[k], body);
      }
      body += 4 * b.Floats();
      offset += m.size();
    }
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool*) const override {
    std::vector<Block> blocks;
    const uint8_t* body;
    TERN_RETURN_IF_ERROR(Parse(in, &blocks, &body));
    size_t offset = 0;
    for (const Block& b : blocks) {
      const absl::Span<float> o = out.subspan(offset, uint64_t{b.rows} * b.cols);
      if (b.rank == 0) {
        DecodeRaw(body, weight, accumulate, o);
      } else {
        DecodeFactors(body, b, weight, accumulate, o);
      }
      body += 4 * b.Floats();
      offset += o.size();
    }
    return absl::OkStatus();
  }
  absl::Status ValidateImpl(const EncodedView& in) const override {
    std::vector<Block> blocks;
    const uint8_t* body;
    return Parse(in, &blocks, &body);
  }

 private:
  // Q from the previous call with this block's shape: the warm start.
  struct Warm {
    uint32_t rows = 0, cols = 0, rank = 0;
    std::vector<float> q;  // cols x rank
  };

  // P = M Q_prev, orthonormalise P, Q = M^T P; writes P then Q at `body`.
  void EncodeBlock(absl::Span<const float> m, const Block& b, uint64_t seed, Warm* w,
                   uint8_t* body) {
    const size_t rows = b.rows, cols = b.cols, r = b.rank;
    if (w->rows != b.rows || w->cols != b.cols || w->rank != b.rank) {
      // (Re)start: Q from counter-based normal draws, so runs are reproducible.
      *w = Warm{b.rows, b.cols, b.rank, std::vector<float>(cols * r)};
      const RngKey key = MakeRngKey(seed, /*stream=*/0x50535144);
      for (size_t i = 0; i < w->q.size(); ++i) w->q[i] = Normal(key, i);
    }
    p_.resize(rows * r);
    powersgd::MatMul(m, w->q, rows, cols, r, absl::MakeSpan(p_));
    powersgd::Orthogonalize(absl::MakeSpan(p_), rows, r);
    powersgd::MatMulT(m, p_, rows, cols, r, absl::MakeSpan(w->q));  // also the next warm start
    std::memcpy(body, p_.data(), 4 * p_.size());
    std::memcpy(body + 4 * p_.size(), w->q.data(), 4 * w->q.size());
  }

  // The block table and where the values start; every check Decode relies on.
  absl::Status Parse(const EncodedView& in, std::vector<Block>* blocks,
                     const uint8_t** body) const {
    if (!in.scales.empty()) return internal::PayloadError(Name(), "expected no scales");
    ByteReader rd(in.payload.data(), in.payload.size());
    uint32_t n;
    if (!rd.U32(&n)) return internal::PayloadError(Name(), "truncated header");
    if (n > in.numel || uint64_t{n} * 12 > rd.remaining()) {
      return internal::PayloadError(Name(), n, " blocks do not fit");
    }
    blocks->resize(n);
    uint64_t total = 0, floats = 0;
    for (uint32_t k = 0; k < n; ++k) {
      Block& b = (*blocks)[k];
      if (!rd.U32(&b.rows) || !rd.U32(&b.cols) || !rd.U32(&b.rank)) {
        return internal::PayloadError(Name(), "truncated block table");
      }
      if (b.rows == 0 || b.cols == 0) return internal::PayloadError(Name(), "empty block ", k);
      if (b.rank > std::min({b.rows, b.cols, kMaxRank})) {
        return internal::PayloadError(Name(), "block ", k, ": rank ", b.rank,
                                      " exceeds min(rows, cols, 256)");
      }
      total += uint64_t{b.rows} * b.cols;
      floats += b.Floats();
      if (total > in.numel) break;
    }
    if (total != in.numel) {
      return internal::PayloadError(Name(), "blocks hold ", total, " elements, numel is ",
                                    in.numel);
    }
    if (rd.remaining() != 4 * floats) {
      return internal::PayloadError(Name(), "expected ", 4 * floats, " value bytes, got ",
                                    rd.remaining());
    }
    // Bounded values keep every sum of r <= 256 products finite (256 * 1e18^2 < FLT_MAX); an
    // orthonormal P has entries <= 1, so only a hostile payload comes near.
    TERN_RETURN_IF_ERROR(internal::CheckF32Values(Name(), rd.ptr(), floats, kMaxValue));
    *body = rd.ptr();
    return absl::OkStatus();
  }

  static void DecodeRaw(const uint8_t* body, float weight, bool accumulate, absl::Span<float> o) {
    for (size_t i = 0; i < o.size(); ++i) {
      float v;
      std::memcpy(&v, body + 4 * i, 4);
      o[i] = accumulate ? o[i] + weight * v : v;
    }
  }

  static void DecodeFactors(const uint8_t* body, const Block& b, float weight, bool accumulate,
                            absl::Span<float> o) {
    const size_t rows = b.rows, cols = b.cols, r = b.rank;
    std::vector<float> p(rows * r), q(cols * r);
    std::memcpy(p.data(), body, 4 * p.size());
    std::memcpy(q.data(), body + 4 * p.size(), 4 * q.size());
    for (size_t i = 0; i < rows; ++i) {
      const float* pi = p.data() + i * r;
      float* oi = o.data() + i * cols;
      for (size_t j = 0; j < cols; ++j) {
        const float* qj = q.data() + j * r;
        float v = 0;
        for (size_t c = 0; c < r; ++c) v += pi[c] * qj[c];
        oi[j] = accumulate ? oi[j] + weight * v : v;
      }
    }
  }

  const uint32_t rank_;
  const std::string params_;
  std::vector<Warm> warm_;  // per block
  std::vector<float> p_;    // scratch, rows x r
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewPowerSgdCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(int64_t rank, params.Int("rank", 4, 1, kMaxRank));
  return std::make_unique<PowerSgdCodec>(static_cast<uint32_t>(rank));
}

}  // namespace tern
