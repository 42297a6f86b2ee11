#include "worker/algorithms/base.h"

#include <cmath>

#include "common/simd.h"

namespace tern {

TERN_MULTIVERSION void Axpy(size_t n, float w, const float* __restrict x, float* __restrict y) {
  for (size_t i = 0; i < n; ++i) y[i] += w * x[i];
}

TERN_MULTIVERSION double SquaredDistance(size_t n, const float* __restrict x,
                                         const float* __restrict y) {
  // Eight running sums, so the loop vectorises without reassociating a single one.
  constexpr size_t kLanes = 8;
  double sum[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      const double d = static_cast<double>(x[i + l]) - static_cast<double>(y[i + l]);
      sum[l] += d * d;
    }
  }
  for (; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - static_cast<double>(y[i]);
    sum[0] += d * d;
  }
  double total = 0;
  for (double s : sum) total += s;
  return total;
}

absl::StatusOr<std::vector<float>> AlgorithmBase::Mix(
    const MixingRow& row, const std::map<int, const GossipMessage*>& received,
    absl::string_view name, absl::Span<const float> self) {
  TERN_RETURN_IF_ERROR(CheckReceived(row, received));
  const size_t n = self.size();
  std::vector<float> acc(n);
  const float ws = static_cast<float>(row.self);
  for (size_t i = 0; i < n; ++i) acc[i] = ws * self[i];
  if (!options_.clip.enabled()) {
    for (const auto& [j, w] : row.neighbours) {
      TERN_RETURN_IF_ERROR(Accumulate(j, *received.at(j), name, w, absl::MakeSpan(acc)));
    }
    return acc;
  }
  // Every part is checked before any is measured, so a bad message leaves the radius as it was.
  std::vector<const EncodedTensor*> parts;
  parts.reserve(row.neighbours.size());
  for (const auto& [j, w] : row.neighbours) {
    TERN_ASSIGN_OR_RETURN(parts.emplace_back(), FindValid(j, *received.at(j), name));
  }
  ClipRadius& radius = RadiusOf(name);
  for (size_t k = 0; k < row.neighbours.size(); ++k) {
    const auto& [j, w] = row.neighbours[k];
    neighbour_.resize(n);
    TERN_RETURN_IF_ERROR(DecodeChecked(j, *parts[k], name, absl::MakeSpan(neighbour_)));
    const double scale =
        radius.Scale(std::sqrt(SquaredDistance(n, neighbour_.data(), self.data())));
    if (scale == 1) {
      Axpy(n, static_cast<float>(w), neighbour_.data(), acc.data());
    } else {  // self + scale (v - self): the weight's remainder stays on self
      Axpy(n, static_cast<float>(w * scale), neighbour_.data(), acc.data());
      Axpy(n, static_cast<float>(w * (1 - scale)), self.data(), acc.data());
    }
  }
  return acc;
}

}  // namespace tern
