#include "core/workload/partition.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "common/status_macros.h"

namespace tern {

std::string PartitionSpec::ToString() const {
  switch (kind) {
    case Kind::kIid:
      return "iid";
    case Kind::kDirichlet:
      return absl::StrCat("dirichlet:alpha=", alpha);
    case Kind::kClasses:
      return absl::StrCat("classes:k=", classes_per_worker);
  }
  return "?";
}

absl::StatusOr<PartitionSpec> ParsePartition(absl::string_view spec) {
  TERN_ASSIGN_OR_RETURN(auto parsed, SpecParams::ParseSpec(spec));
  auto& [name, params] = parsed;
  PartitionSpec out;
  if (name == "iid") {
    out.kind = PartitionSpec::Kind::kIid;
  } else if (name == "dirichlet") {
    out.kind = PartitionSpec::Kind::kDirichlet;
    TERN_ASSIGN_OR_RETURN(out.alpha, params.Double("alpha", 0.5, 1e-3, 1e6));
  } else if (name == "classes") {
    out.kind = PartitionSpec::Kind::kClasses;
    TERN_ASSIGN_OR_RETURN(int64_t k, params.Int("k", 2, 1, 1 << 16));
    out.classes_per_worker = static_cast<int>(k);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown partition '", name, "' (iid, dirichlet:alpha=A, classes:k=K)"));
  }
  TERN_RETURN_IF_ERROR(params.CheckAllUsed(absl::StrCat("partition '", name, "'")));
  return out;
}

absl::StatusOr<std::vector<std::vector<uint32_t>>> Partition(const std::vector<uint8_t>& labels,
                                                             int num_classes, int workers,
                                                             const PartitionSpec& spec,
                                                             uint64_t seed) {
  if (workers < 1) return absl::InvalidArgumentError("partition needs >= 1 worker");
  if (num_classes < 1) return absl::InvalidArgumentError("partition needs >= 1 class");
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint32_t>> parts(workers);
  std::vector<std::vector<uint32_t>> by_class(num_classes);
  for (uint32_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat("label ", int{labels[i]}, " out of range"));
    }
    by_class[labels[i]].push_back(i);
  }
  for (auto& c : by_class) std::shuffle(c.begin(), c.end(), rng);

  switch (spec.kind) {
    case PartitionSpec::Kind::kIid: {
      std::vector<uint32_t> all(labels.size());
      for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
      std::shuffle(all.begin(), all.end(), rng);
      for (size_t i = 0; i < all.size(); ++i) parts[i % workers].push_back(all[i]);
      break;
    }
    case PartitionSpec::Kind::kDirichlet: {
      // Per class, proportions over workers ~ Dir(alpha) (normalised Gamma(alpha, 1) draws).
      std::gamma_distribution<double> gamma(spec.alpha, 1.0);
      for (const auto& members : by_class) {
        std::vector<double> p(workers);
        double sum = 0;
        for (double& v : p) sum += (v = gamma(rng));
        if (sum <= 0) {  // all draws underflowed (tiny alpha): give the class to one worker
          p.assign(workers, 0.0);
          p[rng() % workers] = sum = 1.0;
        }
        size_t begin = 0;
        double cum = 0;
        for (int w = 0; w < workers; ++w) {
          cum += p[w] / sum;
          const size_t end =
              w == workers - 1
                  ? members.size()
                  : std::min(members.size(), static_cast<size_t>(cum * members.size() + 0.5));
          for (size_t i = begin; i < end; ++i) parts[w].push_back(members[i]);
          begin = std::max(begin, end);
        }
      }
      break;
    }
    case PartitionSpec::Kind::kClasses: {
      const int k = std::min(spec.classes_per_worker, num_classes);
      std::vector<std::vector<int>> holders(num_classes);
      for (int w = 0; w < workers; ++w) {
        for (int j = 0; j < k; ++j) holders[(w * k + j) % num_classes].push_back(w);
      }
      for (int c = 0; c < num_classes; ++c) {
        const auto& h = holders[c];
        if (h.empty()) continue;
        const auto& members = by_class[c];
        for (size_t i = 0; i < members.size(); ++i) parts[h[i % h.size()]].push_back(members[i]);
      }
      break;
    }
  }
  for (auto& p : parts) std::shuffle(p.begin(), p.end(), rng);
  return parts;
}

}  // namespace tern
