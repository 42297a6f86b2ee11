#include "kernels/select.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>

#include "common/simd.h"
#include "common/simd_rng.h"
#include "common/thread_pool.h"

namespace tern {
namespace {

constexpr size_t kFilterBlock = 2048;

// Branch-free compaction of one block: writes the passing indices to `buf` and their values to
// `vbuf` (taken while the block is in cache, so later steps never go back to x), returns the
// count.
TERN_MULTIVERSION size_t FilterBlock(const float* x, size_t n, uint32_t base, uint32_t min_key,
                                     uint32_t* buf, float* vbuf) {
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) {
    buf[c] = base + static_cast<uint32_t>(i);
    vbuf[c] = x[i];
    c += (std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu) >= min_key;
  }
  return c;
}

#if defined(TERN_X86_DISPATCH)
// Lines read this far ahead: one thread's stream of loads alone does not keep enough of them in
// flight to read memory at its rate (the sparse loop below over 16M floats: 35 GB/s at 2 KiB
// ahead, 37 at 4, 43-45 at 8, 49-54 at 16, 45 at 32).
constexpr int kPrefetchBytes = 16384;

// The same compaction 16 at a time: compare, then compress the passing lanes (indices and values)
// with VPCOMPRESSD. For blocks where many pass: a group that passes nothing costs a load and a
// compare, but whether one passes is a branch that mispredicts about as often as it is taken.
// kPrefetch where few pass: +18 % at 0.1 % of 16M values, -4 % at 10 %. Writes up to 16 entries
// past the returned count.
template <bool kPrefetch>
TERN_TARGET_AVX512 size_t FilterBlockAvx512(const float* x, size_t n, uint32_t base,
                                            uint32_t min_key, uint32_t* buf, float* vbuf) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i threshold = _mm512_set1_epi32(static_cast<int>(min_key));
  const __m512i sixteen = _mm512_set1_epi32(16);
  __m512i idx =
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(base)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  size_t c = 0, i = 0;
  for (; i + 16 <= n; i += 16) {
    if constexpr (kPrefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
    }
    const __m512i v = _mm512_loadu_si512(x + i);
    const __mmask16 m = _mm512_cmpge_epu32_mask(_mm512_and_si512(v, abs_mask), threshold);
    if (m != 0) {
      _mm512_storeu_si512(buf + c, _mm512_maskz_compress_epi32(m, idx));
      _mm512_storeu_si512(vbuf + c, _mm512_maskz_compress_epi32(m, v));
      c += static_cast<size_t>(__builtin_popcount(m));
    }
    idx = _mm512_add_epi32(idx, sixteen);
  }
  // The last values (under a step's worth) as the plain loop takes them.
  return c + FilterBlock(x + i, n - i, base + static_cast<uint32_t>(i), min_key, buf + c, vbuf + c);
}

// Which of x[0, 16) pass, as the low 16 bits.
TERN_TARGET_AVX512 inline uint64_t Passing16(const float* x, __m512i abs_mask, __m512i threshold) {
  return static_cast<uint64_t>(
      _mm512_cmpge_epu32_mask(_mm512_and_si512(_mm512_loadu_si512(x), abs_mask), threshold));
}

// The compaction for blocks where few pass (the sparse codecs' ~1 %): 64 values a step, one
// 64-bit mask of the passing ones, the first two taken without a branch (written always, counted
// only if they pass) and a loop only for a third and more, which at 1 % is one step in 40: twice
// the compress loop's speed there over 16M floats (49-54 GB/s against 25). Writes up to 2
// entries past the returned count.
TERN_TARGET_AVX512 size_t FilterBlockSparseAvx512(const float* x, size_t n, uint32_t base,
                                                  uint32_t min_key, uint32_t* buf, float* vbuf) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i threshold = _mm512_set1_epi32(static_cast<int>(min_key));
  constexpr uint64_t kNone = uint64_t{1} << 63;  // a stand-in position when none is left
  size_t c = 0, i = 0;
  for (; i + 64 <= n; i += 64) {
    const char* ahead = reinterpret_cast<const char*>(x + i) + kPrefetchBytes;
    for (int line = 0; line < 256; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
    const uint64_t m = Passing16(x + i, abs_mask, threshold) |
                       Passing16(x + i + 16, abs_mask, threshold) << 16 |
                       Passing16(x + i + 32, abs_mask, threshold) << 32 |
                       Passing16(x + i + 48, abs_mask, threshold) << 48;
    const uint64_t second = m & (m - 1);
    const size_t j0 = static_cast<size_t>(std::countr_zero(m | kNone));
    const size_t j1 = static_cast<size_t>(std::countr_zero(second | kNone));
    buf[c] = base + static_cast<uint32_t>(i + j0);
    vbuf[c] = x[i + j0];
    c += m != 0;
    buf[c] = base + static_cast<uint32_t>(i + j1);
    vbuf[c] = x[i + j1];
    c += second != 0;
    for (uint64_t rest = second & (second - 1); rest != 0; rest &= rest - 1) {
      const size_t j = static_cast<size_t>(std::countr_zero(rest));
      buf[c] = base + static_cast<uint32_t>(i + j);
      vbuf[c] = x[i + j];
      ++c;
    }
  }
  // The last values (under a step's worth) as the plain loop takes them.
  return c + FilterBlock(x + i, n - i, base + static_cast<uint32_t>(i), min_key, buf + c, vbuf + c);
}
#endif

// Filters x[begin, end) into *out (indices offset by `base`) and *values. With AVX-512 each
// block takes the loop suited to how many of the block before it passed (all give the same
// entries).
void FilterRange(absl::Span<const float> x, uint32_t base, size_t begin, size_t end,
                 uint32_t min_key, std::vector<uint32_t>* out, std::vector<float>* values) {
  uint32_t buf[kFilterBlock + 16];
  float vbuf[kFilterBlock + 16];
  const bool avx512 = CpuHasAvx512();
  size_t last = 0;  // how many of the block before passed (the first: taken as none)
  for (size_t b = begin; b < end; b += kFilterBlock) {
    const size_t n = std::min(kFilterBlock, end - b);
    const uint32_t at = base + static_cast<uint32_t>(b);
#if defined(TERN_X86_DISPATCH)
    // Between one in 256 and two in 64 (0.4-3 %) the sparse loop rarely loops, and the compress
    // loop's branch mispredicts often. Rarer than that, the branch is seldom taken (and
    // predicted): the compress loop is quicker.
    size_t c;
    if (!avx512) {
      c = FilterBlock(x.data() + b, n, at, min_key, buf, vbuf);
    } else if (last > kFilterBlock / 32) {
      c = FilterBlockAvx512<false>(x.data() + b, n, at, min_key, buf, vbuf);
    } else if (last > kFilterBlock / 256) {
      c = FilterBlockSparseAvx512(x.data() + b, n, at, min_key, buf, vbuf);
    } else {
      c = FilterBlockAvx512<true>(x.data() + b, n, at, min_key, buf, vbuf);
    }
#else
    (void)avx512;
    (void)last;
    const size_t c = FilterBlock(x.data() + b, n, at, min_key, buf, vbuf);
#endif
    last = c;
    out->insert(out->end(), buf, buf + c);
    values->insert(values->end(), vbuf, vbuf + c);
  }
}

// Magnitude keys of a strided sample of about `m` elements.
std::vector<uint32_t> SampleKeys(absl::Span<const float> x, size_t m) {
  const size_t stride = std::max<size_t>(1, x.size() / std::max<size_t>(1, m));
  std::vector<uint32_t> keys;
  keys.reserve(x.size() / stride + 1);
  for (size_t i = stride / 2; i < x.size(); i += stride) keys.push_back(MagnitudeKey(x[i]));
  return keys;
}

// The key of the r-th largest (0-based) element of `keys` (reorders keys).
uint32_t NthLargest(std::vector<uint32_t>& keys, size_t r) {
  std::nth_element(keys.begin(), keys.begin() + r, keys.end(), std::greater<uint32_t>());
  return keys[r];
}

}  // namespace

void KeepTopK(size_t k, std::vector<uint32_t>* cand, std::vector<float>* values) {
  if (cand->size() <= k) return;
  std::vector<uint32_t> keys(cand->size());
  for (size_t i = 0; i < cand->size(); ++i) keys[i] = MagnitudeKey((*values)[i]);
  const uint32_t kth = NthLargest(keys, k - 1);
  size_t above = 0;
  for (float v : *values) above += MagnitudeKey(v) > kth;
  size_t ties = k - above;
  size_t w = 0;
  for (size_t i = 0; i < cand->size(); ++i) {
    const uint32_t key = MagnitudeKey((*values)[i]);
    if (key > kth || (key == kth && ties > 0 && ties--)) {
      (*cand)[w] = (*cand)[i];
      (*values)[w] = (*values)[i];
      ++w;
    }
  }
  cand->resize(w);
  values->resize(w);
}

void AppendAtLeast(absl::Span<const float> x, uint32_t base, uint32_t min_key,
                   std::vector<uint32_t>* indices, std::vector<float>* values) {
  FilterRange(x, base, 0, x.size(), min_key, indices, values);
}

void SelectAtLeast(absl::Span<const float> x, uint32_t min_key, std::vector<uint32_t>* indices,
                   ThreadPool* pool, std::vector<float>* values) {
  std::vector<float> local;
  if (values == nullptr) values = &local;
  indices->clear();
  values->clear();
  const size_t parts = (pool != nullptr && x.size() >= (size_t{1} << 18))
                           ? static_cast<size_t>(pool->num_threads()) + 1
                           : 1;
  if (parts == 1) {
    FilterRange(x, 0, 0, x.size(), min_key, indices, values);
    return;
  }
  std::vector<std::vector<uint32_t>> pieces(parts);
  std::vector<std::vector<float>> vpieces(parts);
  const size_t per = (x.size() + parts - 1) / parts;
  pool->ParallelFor(parts, 1, 1, [&](size_t b, size_t e) {
    for (size_t p = b; p < e; ++p) {
      FilterRange(x, 0, p * per, std::min(x.size(), (p + 1) * per), min_key, &pieces[p],
                  &vpieces[p]);
    }
  });
  size_t total = 0;
  for (auto& p : pieces) total += p.size();
  indices->reserve(total);
  values->reserve(total);
  for (size_t p = 0; p < parts; ++p) {
    indices->insert(indices->end(), pieces[p].begin(), pieces[p].end());
    values->insert(values->end(), vpieces[p].begin(), vpieces[p].end());
  }
}

void SelectTopK(absl::Span<const float> x, size_t k, std::vector<uint32_t>* indices,
                ThreadPool* pool, std::vector<float>* values) {
  std::vector<float> local;
  if (values == nullptr) values = &local;
  const size_t d = x.size();
  indices->clear();
  values->clear();
  if (k == 0) return;
  if (k >= d) {
    indices->resize(d);
    for (size_t i = 0; i < d; ++i) (*indices)[i] = static_cast<uint32_t>(i);
    values->assign(x.begin(), x.end());
    return;
  }
  // A sample of m elements; its element of rank q (above the expected k*m/d by a few standard
  // deviations) is very likely below the true k-th magnitude, so filtering by it keeps all of the
  // top-k plus a few percent more.
  const size_t m = std::min(d, std::max<size_t>(4096, d / 64));
  std::vector<uint32_t> sample = SampleKeys(x, m);
  const double r = static_cast<double>(k) * sample.size() / d;
  const size_t q = std::min(sample.size() - 1, static_cast<size_t>(r + 4 * std::sqrt(r) + 8));
  const uint32_t bound = NthLargest(sample, q);
  SelectAtLeast(x, bound, indices, pool, values);
  if (indices->size() < k) {
    // The sample misled us (adversarial layout): exact selection over every magnitude.
    std::vector<uint32_t> keys(d);
    for (size_t i = 0; i < d; ++i) keys[i] = MagnitudeKey(x[i]);
    SelectAtLeast(x, NthLargest(keys, k - 1), indices, pool, values);
  }
  KeepTopK(k, indices, values);
}

DgcSelection SelectDgc(absl::Span<const float> x, size_t k, double sample_ratio,
                       std::vector<uint32_t>* indices, ThreadPool* pool,
                       std::vector<float>* values) {
  std::vector<float> local;
  if (values == nullptr) values = &local;
  DgcSelection sel;
  indices->clear();
  values->clear();
  const size_t d = x.size();
  if (k == 0 || d == 0) return sel;
  if (k >= d) {
    SelectTopK(x, k, indices, pool, values);
    sel.selected = indices->size();
    return sel;
  }
  const size_t m = std::min(d, std::max<size_t>(64, static_cast<size_t>(sample_ratio * d)));
  std::vector<uint32_t> sample = SampleKeys(x, m);
  const size_t r = std::min(sample.size() - 1,
                            static_cast<size_t>(std::ceil(double(k) * sample.size() / d)) - 1);
  uint32_t key = NthLargest(sample, r);
  for (sel.tries = 1;; ++sel.tries) {
    SelectAtLeast(x, key, indices, pool, values);
    sel.threshold_key = key;
    sel.selected = indices->size();
    if (indices->size() > k + 3 * k / 10) {  // > 1.3k: exact top-k of the selected
      KeepTopK(k, indices, values);
      break;
    }
    if (10 * indices->size() >= 8 * k || sel.tries == 10 || key == 0) break;
    key = MagnitudeKey(std::bit_cast<float>(key) * 0.8f);  // < 0.8k: lower the threshold
  }
  return sel;
}

}  // namespace tern
