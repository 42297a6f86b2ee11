// Shared body of the element-wise "cast" codecs (none, fp16, bf16): the payload is numel words of
// Traits::Word, little-endian, nothing else. Each codec's .cc supplies its traits and hot loops.
// Internal to kernels/.
#ifndef TERN_KERNELS_CPU_CAST_CODEC_H_
#define TERN_KERNELS_CPU_CAST_CODEC_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "kernels/codec.h"
#include "kernels/cpu/codec_util.h"
#include "kernels/format/cast.h"
#include "kernels/format/payload.h"

namespace tern::internal {

// Traits: kFormat (kernels/format/cast.h), kLossless, kWordsAreFloats (the words are the fp32
// values themselves: decoding is a copy),
//   static void EncodeLoop(const float* x, uint8_t* out, size_t n);
//   static void DecodeLoop(const uint8_t* in, float* out, size_t n);          // overwrite
//   static void AccumulateLoop(const uint8_t* in, float w, float* out, size_t n);
template <typename Traits>
class CastCodec final : public Codec {
 public:
  absl::string_view Name() const override { return Traits::kFormat.name; }
  std::string Spec() const override { return Traits::kFormat.spec; }
  bool lossless() const override { return Traits::kLossless; }
  // Words are read in runs wherever they are: a payload received in pieces is decoded from them.
  bool ReadsPieces() const override { return true; }

  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    if (absl::Status s = CheckNumel(Name(), x.size()); !s.ok()) return s;
    SetHeader(*this, "", x.size(), out);
    out->scales.clear();
    uint8_t* p = ResizePayload(&out->payload, x.size() * Traits::kFormat.word_bytes);
    ParallelFor(options.pool, x.size(), kGrain, 64, [&](size_t b, size_t e) {
      Traits::EncodeLoop(x.data() + b, p + b * Traits::kFormat.word_bytes, e - b);
    });
    return absl::OkStatus();
  }

 protected:
  // A cast payload is valid when its size matches and every word is finite: no decode needed.
  absl::Status ValidateImpl(const EncodedView& in) const override {
    if (absl::Status s = format::CheckCastPayload(Traits::kFormat, in); !s.ok()) return s;
    return format::CheckCastFinite(Traits::kFormat, in);
  }

  // Decoded a block at a time on the stack: no tensor-sized scratch, and one pass (Inf or NaN
  // anywhere makes the sum non-finite, which is the finiteness check).
  absl::StatusOr<double> NormImpl(const EncodedView& in) const override {
    if (absl::Status s = format::CheckCastPayload(Traits::kFormat, in); !s.ok()) return s;
    Sum sum;
    if (in.pieces.empty()) {
      sum.Add(in.payload.data(), in.numel);
    } else {
      format::ForEachWordRun(in.pieces, kWord,
                             [&sum](const uint8_t* w, size_t, size_t n) { sum.Add(w, n); });
    }
    return sum.Norm(in);
  }

 public:
  // The same sum over the words as they arrive.
  std::unique_ptr<PayloadScan> NewPayloadScan() const override {
    return std::make_unique<Scan>(this);
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool* pool) const override {
    if (absl::Status s = format::CheckCastPayload(Traits::kFormat, in); !s.ok()) return s;
    if (!in.checked) {
      if (absl::Status s = format::CheckCastFinite(Traits::kFormat, in); !s.ok()) return s;
    }
    const auto run = [&](const uint8_t* words, size_t first, size_t n) {
      if (accumulate) {
        Traits::AccumulateLoop(words, weight, out.data() + first, n);
      } else {
        Traits::DecodeLoop(words, out.data() + first, n);
      }
    };
    if (!in.pieces.empty()) {  // received in place: one pass over the pieces, in order
      format::ForEachWordRun(in.pieces, kWord, run);
      return absl::OkStatus();
    }
    const uint8_t* p = in.payload.data();
    ParallelFor(pool, out.size(), kGrain, 64,
                [&](size_t b, size_t e) { run(p + b * kWord, b, e - b); });
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kGrain = size_t{1} << 16;
  static constexpr size_t kWord = Traits::kFormat.word_bytes;

  // Σ x², decoded and summed in blocks of kBlock words from the payload's start, whether the
  // words come at once (NormImpl) or in pieces (Scan): the same blocks, so the same bits.
  class Sum {
   public:
    // `n` more whole words.
    void Add(const uint8_t* words, size_t n) {
      while (n > 0) {
        if constexpr (Traits::kWordsAreFloats) {
          // A whole block of fp32 words at hand is summed where it lies: no copy to decode.
          if (filled_ == 0 && n >= kBlock) {
            sum_ += SquaredL2NormOfWords(words, kBlock);
            words += kBlock * kWord;
            n -= kBlock;
            continue;
          }
        }
        const size_t k = std::min(n, kBlock - filled_);
        Traits::DecodeLoop(words, block_ + filled_, k);
        filled_ += k;
        words += k * kWord;
        n -= k;
        if (filled_ == kBlock) Flush();
      }
    }
    absl::StatusOr<double> Norm(const EncodedView& in) {
      Flush();
      if (!std::isfinite(sum_)) return format::CheckCastFinite(Traits::kFormat, in);
      return std::sqrt(sum_);
    }

   private:
    static constexpr size_t kBlock = 1024;
    void Flush() {
      if (filled_ > 0) sum_ += SquaredL2Norm(absl::MakeConstSpan(block_, filled_));
      filled_ = 0;
    }
    float block_[kBlock];
    size_t filled_ = 0;
    double sum_ = 0;
  };

  class Scan final : public PayloadScan {
   public:
    explicit Scan(const CastCodec* codec) : codec_(codec) {}
    void Feed(absl::string_view bytes) override {
      fed_ += bytes.size();
      runs_.Feed(bytes, [this](const uint8_t* words, size_t, size_t n) { sum_.Add(words, n); });
    }
    uint64_t fed() const override { return fed_; }
    absl::StatusOr<double> Finish(const EncodedView& in) override {
      if (fed_ != in.PayloadSize()) {
        return absl::FailedPreconditionError("the scan did not see the whole payload");
      }
      if (absl::Status s = CheckView(codec_->Name(), in, in.numel); !s.ok()) return s;
      if (absl::Status s = format::CheckCastPayload(Traits::kFormat, in); !s.ok()) return s;
      return sum_.Norm(in);
    }

   private:
    const CastCodec* const codec_;
    Sum sum_;
    format::WordRuns runs_{kWord};
    uint64_t fed_ = 0;
  };
};

}  // namespace tern::internal

#endif  // TERN_KERNELS_CPU_CAST_CODEC_H_
