// Deep Gradient Compression's worker memory: momentum correction and factor masking around a
// sparsifier, with local gradient clipping and the exponential sparsity warm-up.
//   g <- clip(g, clip_norm / sqrt(n));  u <- m u + g;  v <- v + u;  send C(v);
//   at the sent indices: v <- 0, u <- 0.
// Warm-up: the kept ratio decays exponentially from 25 % to `ratio` over `warmup_epochs`
// (25 %, 6.25 %, 1.56 %, 0.39 %, 0.1 % for four epochs to 0.1 %, as in the paper).
//
// Thread-safety: not thread-safe; one instance per tensor stream.
#ifndef TERN_KERNELS_DGC_MEMORY_H_
#define TERN_KERNELS_DGC_MEMORY_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/codec.h"

namespace tern {

struct DgcOptions {
  // Final fraction of values sent per step.
  double ratio = 0.001;
  // Momentum m of the momentum correction (0 disables it).
  double momentum = 0.9;
  // Global clipping norm; each worker clips at clip_norm / sqrt(num_workers). 0 disables clipping.
  double clip_norm = 0.0;
  int num_workers = 1;
  // Epochs over which the ratio decays from 25 % to `ratio`; 0 starts at `ratio`.
  double warmup_epochs = 4.0;
  // Sparsifier: true uses exact top-k ("topk"), false DGC's sampled threshold ("dgc").
  bool exact_topk = false;
  // Sample fraction for the sampled threshold.
  double sample = 0.01;
};

class DgcMemory {
 public:
  static absl::StatusOr<std::unique_ptr<DgcMemory>> Create(const DgcOptions& options);

  // Sets the (fractional) epoch the warm-up schedule is evaluated at.
  void SetEpoch(double epoch) { epoch_ = epoch; }
  // The ratio in force at the current epoch.
  double CurrentRatio() const;

  // One step: accumulates g into the memory and encodes what is sent.
  absl::Status Encode(absl::Span<const float> g, const EncodeOptions& options, EncodedTensor* out);

  absl::Span<const float> momentum() const { return u_; }
  absl::Span<const float> accumulated() const { return v_; }

 private:
  explicit DgcMemory(const DgcOptions& options) : options_(options) {}

  DgcOptions options_;
  double epoch_ = 0;
  double codec_ratio_ = -1;  // ratio the cached codec was made with
  std::unique_ptr<Codec> codec_;
  std::vector<float> u_, v_, clipped_;
  std::vector<uint32_t> sent_;
};

}  // namespace tern

#endif  // TERN_KERNELS_DGC_MEMORY_H_
