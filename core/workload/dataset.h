// Training data for the built-in trainer: Fashion-MNIST read from the IDX .gz files that Debian's
// dataset-fashion-mnist package installs, or a synthetic stand-in when they are absent.
//
// Thread-safety: free functions are thread-safe; a Dataset is a plain value.
#ifndef TERN_CORE_WORKLOAD_DATASET_H_
#define TERN_CORE_WORKLOAD_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tern {

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

struct Dataset {
  size_t dim = 0;  // features per example
  int num_classes = 0;
  std::vector<float> features;  // size() x dim, row-major, normalised
  std::vector<uint8_t> labels;  // in [0, num_classes)
  std::string source;           // human-readable origin, e.g. the directory or "synthetic"

  size_t size() const { return labels.size(); }
  const float* row(size_t i) const { return features.data() + i * dim; }
};

struct TrainTest {
  Dataset train;
  Dataset test;
  bool synthetic = false;
};

// An IDX array (the MNIST family's format): unsigned bytes with their dimensions.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

// Parses IDX bytes: 0x00 0x00, type 0x08 (unsigned byte), rank 1..4, big-endian u32 dims, then
// exactly prod(dims) bytes. The bytes are untrusted: anything else, or more than `max_elements`
// elements, is InvalidArgument.
absl::StatusOr<IdxArray> ParseIdx(absl::string_view bytes, size_t max_elements);

// Reads a whole gzip file, refusing to inflate past `max_bytes`.
absl::StatusOr<std::string> ReadGzipFile(const std::string& path, size_t max_bytes);

// Loads train and test splits from `dir` (train-images-idx3-ubyte.gz and friends). Pixels become
// (p / 255 - 0.2860) / 0.3530, Fashion-MNIST's mean and standard deviation.
absl::StatusOr<TrainTest> LoadFashionMnist(const std::string& dir);

// A 10-class Gaussian-mixture stand-in with Fashion-MNIST's shape (784 features), reproducible
// from `seed`: hard enough that a linear model does not reach 100 %.
TrainTest SyntheticData(size_t train_size, size_t test_size, uint64_t seed);

// `dir` empty: Fashion-MNIST from kDefaultFashionMnistDir when it is there, otherwise synthetic
// data (TrainTest::synthetic says which). `dir` given: that directory or an error.
absl::StatusOr<TrainTest> LoadTrainingData(const std::string& dir, uint64_t seed);

}  // namespace tern

#endif  // TERN_CORE_WORKLOAD_DATASET_H_
