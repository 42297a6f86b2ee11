// none.v1, fp16.v1, bf16.v1: one little-endian word per element (4, 2, 2 bytes), no scales, no
// header, no parameters (docs/wire-format.md). Shared by kernels/cpu/cast_codec.h and
// kernels/cuda/cast.cu.
#ifndef TERN_KERNELS_FORMAT_CAST_H_
#define TERN_KERNELS_FORMAT_CAST_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/codec.h"

namespace tern::format {

struct CastFormat {
  const char* name;  // wire name, "fp16.v1"
  const char* spec;  // spec name, "fp16"
  size_t word_bytes;
  uint32_t exponent_mask;  // a word with all these bits set is Inf or NaN
};
inline constexpr CastFormat kNone{"none.v1", "none", 4, 0x7f800000u};
inline constexpr CastFormat kFp16{"fp16.v1", "fp16", 2, 0x7c00u};
inline constexpr CastFormat kBf16{"bf16.v1", "bf16", 2, 0x7f80u};

// Whole words (`word_bytes`, at most 8) of bytes that come in pieces, in order: Feed calls
// fn(words, first, n) for each run of consecutive words where they are, and for each word split
// between pieces once its bytes are gathered (n = 1); `first` is the index of a run's first word.
// Bytes after the last whole word are never passed on (callers check the size first).
class WordRuns {
 public:
  explicit WordRuns(size_t word_bytes) : word_(word_bytes) {}

  template <typename Fn>
  void Feed(absl::string_view piece, Fn&& fn) {
    const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
    size_t n = piece.size();
    if (carried_ > 0) {
      const size_t k = std::min(word_ - carried_, n);
      std::memcpy(carry_ + carried_, p, k);
      carried_ += k;
      p += k;
      n -= k;
      if (carried_ < word_) return;
      fn(static_cast<const uint8_t*>(carry_), index_++, size_t{1});
    }
    if (n >= word_) {
      fn(p, index_, n / word_);
      index_ += n / word_;
    }
    carried_ = n % word_;
    std::memcpy(carry_, p + n - carried_, carried_);
  }

 private:
  const size_t word_;
  uint8_t carry_[8] = {};
  size_t carried_ = 0;
  size_t index_ = 0;
};

// WordRuns over all of `pieces`.
template <typename Fn>
void ForEachWordRun(absl::Span<const absl::string_view> pieces, size_t word_bytes, Fn&& fn) {
  WordRuns runs(word_bytes);
  for (absl::string_view piece : pieces) runs.Feed(piece, fn);
}

// No scales and exactly numel words.
absl::Status CheckCastPayload(const CastFormat& f, const EncodedView& in);

// Every word of a (checked) payload in host memory (in one place or in pieces) is finite: Inf or
// NaN is refused before anything is written, so a refused payload changes nothing.
absl::Status CheckCastFinite(const CastFormat& f, const EncodedView& in);

}  // namespace tern::format

#endif  // TERN_KERNELS_FORMAT_CAST_H_
