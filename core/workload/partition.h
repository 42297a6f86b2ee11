// Splitting a dataset over workers: iid, Dirichlet(alpha) label skew, or k classes per worker.
//
// Thread-safety: pure functions.
#ifndef TERN_CORE_WORKLOAD_PARTITION_H_
#define TERN_CORE_WORKLOAD_PARTITION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tern {

struct PartitionSpec {
  enum class Kind { kIid, kDirichlet, kClasses };
  Kind kind = Kind::kIid;
  double alpha = 0.5;          // kDirichlet: smaller is more skewed
  int classes_per_worker = 2;  // kClasses
  std::string ToString() const;
};

// "iid", "dirichlet[:alpha=A]" or "classes[:k=K]".
absl::StatusOr<PartitionSpec> ParsePartition(absl::string_view spec);

// Example indices for each of `workers` workers, reproducible from `seed`. iid and Dirichlet
// hand out every example exactly once; with "classes" each worker gets only its k classes, and a
// class nobody holds (workers * k < num_classes) goes unused.
absl::StatusOr<std::vector<std::vector<uint32_t>>> Partition(const std::vector<uint8_t>& labels,
                                                             int num_classes, int workers,
                                                             const PartitionSpec& spec,
                                                             uint64_t seed);

}  // namespace tern

#endif  // TERN_CORE_WORKLOAD_PARTITION_H_
