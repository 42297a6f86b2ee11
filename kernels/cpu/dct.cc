#include "kernels/cpu/dct.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/status_macros.h"
#include "kernels/cpu/sparse_format.h"
#include "kernels/format/sparse.h"
#include "kernels/select.h"

namespace tern {
namespace {

constexpr uint8_t kStateVersion = 1;
constexpr size_t kStateBytes = 1 + 4 + 4 + 8;
constexpr uint32_t kInfinityKey = 0x7f800000u;

class DctCodec final : public internal::SparseCodec {
 public:
  explicit DctCodec(const format::DctParams& p)
      : SparseCodec(p.Spec(), p.Canonical()), ratio_(p.ratio), every_(p.every) {}
  absl::string_view Name() const override { return format::kDctName; }

  std::string SaveEncoderState() const override {
    if (numel_ == 0) return "";  // nothing estimated yet
    std::string out;
    ByteWriter w(&out);
    w.U8(kStateVersion);
    w.U32(key_);
    w.U32(left_);
    w.U64(numel_);
    return out;
  }

  absl::Status RestoreEncoderState(absl::string_view state) override {
    if (state.empty()) {
      numel_ = 0;
      return absl::OkStatus();
    }
    ByteReader r(reinterpret_cast<const uint8_t*>(state.data()), state.size());
    uint8_t version = 0;
    uint32_t key = 0, left = 0;
    uint64_t numel = 0;
    if (state.size() != kStateBytes || !r.U8(&version) || !r.U32(&key) || !r.U32(&left) ||
        !r.U64(&numel) || version != kStateVersion || key == 0 || key > kInfinityKey ||
        left >= every_ || numel == 0 || numel > UINT32_MAX) {
      numel_ = 0;
      return absl::InvalidArgumentError(absl::StrCat(
          "codec ", Spec(), ": not an encoder state it saved (", state.size(), " bytes)"));
    }
    key_ = key;
    left_ = left;
    numel_ = numel;
    return absl::OkStatus();
  }

 protected:
  void Select(absl::Span<const float> x, ThreadPool* pool, std::vector<uint32_t>* indices,
              std::vector<float>* values) override {
    if (numel_ == x.size() && left_ > 0) {
      --left_;
      SelectAtLeast(x, key_, indices, pool, values);
      return;
    }
    // An estimate: this encode is exactly top-k, and its k-th magnitude the next ones' threshold.
    SelectTopK(x, format::SparseK(ratio_, x.size()), indices, pool, values);
    uint32_t kth = kInfinityKey;
    for (float v : *values) kth = std::min(kth, MagnitudeKey(v));
    key_ = std::max<uint32_t>(kth, 1);
    left_ = every_ - 1;
    numel_ = x.size();
  }

 private:
  const double ratio_;
  const uint32_t every_;
  uint32_t key_ = 1;    // the threshold, as MagnitudeKey
  uint32_t left_ = 0;   // encodes left before the next estimate
  uint64_t numel_ = 0;  // the size key_ was estimated for; 0: none yet
};

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> NewDctCodec(SpecParams& params) {
  TERN_ASSIGN_OR_RETURN(format::DctParams p, format::ParseDctParams(params));
  return std::make_unique<DctCodec>(p);
}

}  // namespace tern
