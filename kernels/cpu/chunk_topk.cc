#include "kernels/cpu/chunk_topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bit_io.h"
#include "common/status_macros.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/format/chunk_topk.h"
#include "kernels/select.h"

namespace tern {
namespace {

class ChunkTopKCodec final : public Codec {
 public:
  explicit ChunkTopKCodec(const format::ChunkTopKParams& p) : format_(p), params_(p.Canonical()) {}
  absl::string_view Name() const override { return format::kChunkTopKName; }
  std::string Spec() const override { return format_.Spec(); }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions&,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(internal::CheckNumel(Name(), x.size()));
    const format::ChunkTopKParams& p = format_;
    const size_t nc = p.Chunks(x.size()), kept = p.Kept(x.size());
    const uint32_t levels = p.levels();
    internal::SetHeader(*this, params_, x.size(), out);
    out->scales.assign(nc * levels, 0.0f);
    // The indices in place; the codes (LSB first, common/bit_io.h's order) appended after them.
    uint8_t* payload =
        internal::ResizePayload(&out->payload, format::kChunkTopKHeaderBytes + 2 * kept);
    format::WriteChunkTopKHeader(p, payload);
    uint8_t* indices = payload + format::kChunkTopKHeaderBytes;
    std::string codes;
    BitWriter code_bits(&codes);
    std::vector<uint32_t> idx;
    std::vector<float> val;
    std::vector<uint32_t> rank;
    std::vector<uint32_t> level_of;
    size_t at = 0;
    for (size_t c = 0; c < nc; ++c) {
      const size_t begin = c * p.chunk;
      const size_t len = std::min<size_t>(p.chunk, x.size() - begin);
      const size_t kc = std::min<size_t>(p.k, len);
      SelectTopK(x.subspan(begin, len), kc, &idx, nullptr, &val);
      // Levels: the kept magnitudes by rank (ties to the lower index), in `levels` equal groups,
      // each group's mean; an empty group repeats the level below it.
      rank.resize(kc);
      std::iota(rank.begin(), rank.end(), 0u);
      std::sort(rank.begin(), rank.end(), [&](uint32_t a, uint32_t b) {
        const uint32_t ka = MagnitudeKey(val[a]), kb = MagnitudeKey(val[b]);
        return ka != kb ? ka < kb : a < b;
      });
      level_of.resize(kc);
      float* level = out->scales.data() + c * levels;
      for (uint32_t g = 0; g < levels; ++g) {
        const size_t lo = g * kc / levels, hi = (g + 1) * kc / levels;
        double sum = 0;
        for (size_t r = lo; r < hi; ++r) {
          sum += std::fabs(val[rank[r]]);
          level_of[rank[r]] = g;
        }
        level[g] = hi > lo ? static_cast<float>(sum / static_cast<double>(hi - lo))
                           : (g > 0 ? level[g - 1] : 0.0f);
        if (!std::isfinite(level[g])) {
          return absl::InvalidArgumentError(
              absl::StrCat(Name(), ": a non-finite value in chunk ", c));
        }
      }
      for (size_t j = 0; j < kc; ++j, ++at) {
        const uint16_t local = static_cast<uint16_t>(idx[j]);
        std::memcpy(indices + 2 * at, &local, 2);
        const uint32_t sign = std::signbit(val[j]) && level[level_of[j]] != 0 ? 1u : 0u;
        code_bits.Write(level_of[j] | (sign << (p.bits - 1)), static_cast<int>(p.bits));
      }
    }
    code_bits.Finish();  // zero padding to the byte
    out->payload.append(codes);
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool*) const override {
    TERN_ASSIGN_OR_RETURN(const format::ChunkTopKHeader h, format::ReadChunkTopKHeader(in));
    const format::ChunkTopKParams& p = h.params;
    const uint32_t levels = p.levels(), mask = levels - 1;
    if (!accumulate) std::fill(out.begin(), out.end(), 0.0f);
    // ReadChunkTopKHeader checked the sizes: every Read below has its bits.
    BitReader code_bits(h.codes, (h.kept * p.bits + 7) / 8);
    size_t at = 0;
    for (size_t c = 0; c < h.chunks; ++c) {
      const size_t begin = c * p.chunk;
      const size_t kc = std::min<size_t>(p.k, std::min<size_t>(p.chunk, in.numel - begin));
      const float* level = in.scales.data() + c * levels;
      for (size_t j = 0; j < kc; ++j, ++at) {
        uint16_t local;
        std::memcpy(&local, h.indices + 2 * at, 2);
        uint64_t code = 0;
        code_bits.Read(static_cast<int>(p.bits), &code);
        const float v = (code >> (p.bits - 1)) & 1 ? -level[code & mask] : level[code & mask];
        internal::Store<true>(out.data(), begin + local, v, accumulate ? weight : 1.0f);
      }
    }
    return absl::OkStatus();
  }

 private:
  const format::ChunkTopKParams format_;
  const std::string params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewChunkTopKCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::ChunkTopKParams p, format::ParseChunkTopKParams(params));
  return std::make_unique<ChunkTopKCodec>(p);
}

}  // namespace tern
