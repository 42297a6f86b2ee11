// Index selection for the sparsifying codecs: exact top-k in O(d), threshold filtering, and DGC's
// sampled-threshold selection. Every function returns indices in ascending order, which is what the
// sparse payloads store (and what lets their decoders reject duplicates cheaply).
//
// Magnitudes are compared as the bit pattern of |x| (an order-preserving uint32 for non-NaN), so
// selection is exact and identical on every platform. NaN sorts above +Inf.
//
// Thread-safety: pure functions; `pool` may be shared.
#ifndef TERN_KERNELS_SELECT_H_
#define TERN_KERNELS_SELECT_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tern {

class ThreadPool;

inline uint32_t MagnitudeKey(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }

// Replaces *indices with the k indices of largest |x|, ascending. Ties at the k-th magnitude go to
// the lower indices. O(d): a strided sample bounds the k-th magnitude from below, one filtering
// pass keeps ~k candidates, and a selection among them finishes; if the sample's bound turns out
// too high, it falls back to nth_element over all magnitudes.
// With `values`, also replaces *values with x at those indices (gathered during the filtering
// pass, which saves the caller a second, cache-missing pass over x).
void SelectTopK(absl::Span<const float> x, size_t k, std::vector<uint32_t>* indices,
                ThreadPool* pool = nullptr, std::vector<float>* values = nullptr);

// Replaces *indices with every i such that MagnitudeKey(x[i]) >= min_key, ascending (and
// *values with their values, when given).
void SelectAtLeast(absl::Span<const float> x, uint32_t min_key, std::vector<uint32_t>* indices,
                   ThreadPool* pool = nullptr, std::vector<float>* values = nullptr);

// Appends (base + i, x[i]) to *indices and *values for every i with MagnitudeKey(x[i]) >= min_key,
// in order: one block of a pass the caller makes itself (CHOCO filters each block of x - x_hat
// while it is in cache, so the whole vector is never stored).
void AppendAtLeast(absl::Span<const float> x, uint32_t base, uint32_t min_key,
                   std::vector<uint32_t>* indices, std::vector<float>* values);

// From ascending candidates and their values, keeps exactly the k largest magnitudes, ascending:
// SelectTopK's answer for any input whose elements of at least the k-th largest magnitude are
// all among the candidates.
void KeepTopK(size_t k, std::vector<uint32_t>* indices, std::vector<float>* values);

struct DgcSelection {
  uint32_t threshold_key = 0;  // the last threshold tried
  int tries = 0;               // filtering passes made (1..10)
  size_t selected = 0;         // count at the final threshold, before any trim to k
};

// Deep Gradient Compression's selection: threshold from the top of a strided sample of
// `sample_ratio` * d elements; if more than 1.3k pass, keep the exact top-k of those; if fewer than
// 0.8k, lower the threshold by 0.8x and retry, at most 10 passes in all.
DgcSelection SelectDgc(absl::Span<const float> x, size_t k, double sample_ratio,
                       std::vector<uint32_t>* indices, ThreadPool* pool = nullptr,
                       std::vector<float>* values = nullptr);

}  // namespace tern

#endif  // TERN_KERNELS_SELECT_H_
