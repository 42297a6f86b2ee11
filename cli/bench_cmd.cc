// `tern bench codecs|transport|model` and `tern codecs`: what each reads of its flags (the
// benchmarks themselves: bench_codecs.h, bench_transport.h, bench_model.h).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/bench_codecs.h"
#include "cli/bench_model.h"
#include "cli/bench_transport.h"
#include "cli/command_table.h"
#include "cli/commands.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/train_flags.h"
#include "clients/flags/worker_flags.h"
#include "kernels/builtin.h"

ABSL_DECLARE_FLAG(bool, tls);

ABSL_FLAG(std::string, sizes, "1M,16M", "bench: tensor sizes in floats (K/M suffixes)");
ABSL_FLAG(std::string, codecs, "", "bench: comma-separated codec specs; '' = all codecs");
ABSL_FLAG(tern::Int<tern::In(1, 1024)>, threads, 1,
          "bench: threads per encode/decode (targets are for 1)");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, min_time, 0.2, "bench: minimum seconds per measurement");
ABSL_FLAG(tern::Int<tern::In(1, 210)>, repeats, 5, "bench transport: timed pushes per size");
ABSL_FLAG(std::string, json, "", "bench: also write results as JSON lines to this file");

namespace tern {
namespace {

bool ParseSize(absl::string_view s, uint64_t* out) {
  uint64_t mult = 1;
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) mult = 1 << 20;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) mult = 1 << 10;
  if (mult != 1) s.remove_suffix(1);
  uint64_t v;
  if (!absl::SimpleAtoi(s, &v) || v == 0) return false;
  *out = v * mult;
  return true;
}

// --sizes as element counts, or an error naming the bad entry.
absl::StatusOr<std::vector<uint64_t>> SizesFlag() {
  std::vector<uint64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    uint64_t n;
    if (!ParseSize(s, &n)) {
      return absl::InvalidArgumentError(absl::StrCat("bad --sizes entry '", s, "'"));
    }
    sizes.push_back(n);
  }
  return sizes;
}

// Splits "topk:ratio=0.01,dgc:ratio=0.001,sample=0.02" into specs: a piece without ':' that holds
// '=' continues the previous spec's parameter list.
std::vector<std::string> SplitSpecs(absl::string_view list) {
  std::vector<std::string> specs;
  for (absl::string_view piece : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    if (!specs.empty() && piece.find(':') == piece.npos && piece.find('=') != piece.npos) {
      absl::StrAppend(&specs.back(), ",", piece);
    } else {
      specs.emplace_back(piece);
    }
  }
  return specs;
}

}  // namespace

int CodecsMain(const std::vector<std::string>&) {
  auto registry = NewBuiltinCodecRegistry();
  for (const std::string& name : registry->Names()) {
    auto codec = registry->Create(name);
    std::printf("%-16s %-20s default: %s\n", name.c_str(), std::string((*codec)->Name()).c_str(),
                (*codec)->Spec().c_str());
  }
  return 0;
}

int BenchCodecsMain(const std::vector<std::string>&) {
  BenchCodecsOptions options;
  absl::StatusOr<std::vector<uint64_t>> sizes = SizesFlag();
  if (!sizes.ok()) return UsageError(std::string(sizes.status().message()));
  options.sizes = *std::move(sizes);
  options.specs = SplitSpecs(absl::GetFlag(FLAGS_codecs));
  if (options.specs.empty()) options.specs = DefaultBenchSpecs();
  options.threads = absl::GetFlag(FLAGS_threads).value;
  options.min_seconds = absl::GetFlag(FLAGS_min_time).value;
  options.json_path = absl::GetFlag(FLAGS_json);
  if (auto s = RunBenchCodecs(options); !s.ok()) return UsageError(s.ToString());
  return 0;
}

int BenchTransportMain(const std::vector<std::string>&) {
  BenchTransportOptions options;
  absl::StatusOr<std::vector<uint64_t>> sizes = SizesFlag();
  if (!sizes.ok()) return UsageError(std::string(sizes.status().message()));
  options.sizes = *std::move(sizes);
  options.repeats = absl::GetFlag(FLAGS_repeats).value;
  options.tls = absl::GetFlag(FLAGS_tls);
  options.push_stripes = absl::GetFlag(FLAGS_push_stripes).value;
  if (auto s = RunBenchTransport(options); !s.ok()) return UsageError(s.ToString());
  return 0;
}

int BenchModelMain(const std::vector<std::string>&) {
  BenchModelOptions options;
  options.model = ModelFlag();
  options.batch = BatchFlag();
  options.min_seconds = absl::GetFlag(FLAGS_min_time).value;
  if (auto s = RunBenchModel(options, ComputeThreadsFlag()); !s.ok())
    return UsageError(s.ToString());
  return 0;
}

}  // namespace tern
