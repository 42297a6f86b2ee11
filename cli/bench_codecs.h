// `tern bench codecs`: encode/decode throughput of every codec against a memcpy of the same buffer
// measured in the same run, plus compression ratio and bits per coordinate.
#ifndef TERN_CLI_BENCH_CODECS_H_
#define TERN_CLI_BENCH_CODECS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tern {

struct BenchCodecsOptions {
  std::vector<uint64_t> sizes;     // element counts
  std::vector<std::string> specs;  // codec specs
  int threads = 1;                 // 1: single-threaded (the targets are single-thread)
  double min_seconds = 0.2;        // per measurement, at least 3 repetitions
  std::string json_path;           // optional JSON-lines output
};

// The default codec list: every codec, sparsifiers at 1 %.
std::vector<std::string> DefaultBenchSpecs();

// Runs the benchmark, printing the table to stdout.
absl::Status RunBenchCodecs(const BenchCodecsOptions& options);

}  // namespace tern

#endif  // TERN_CLI_BENCH_CODECS_H_
