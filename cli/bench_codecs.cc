#include "cli/bench_codecs.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_lines.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "kernels/builtin.h"
#include "tern/v1/records.pb.h"

namespace tern {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Median seconds of fn() over repetitions lasting at least `min_seconds` in all (>= 3 runs).
double TimeMedian(double min_seconds, const std::function<absl::Status()>& fn, absl::Status* err) {
  std::vector<double> runs;
  double total = 0;
  while (runs.size() < 3 || (total < min_seconds && runs.size() < 200)) {
    const auto t0 = SteadyClock::now();
    absl::Status s = fn();
    const double dt = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    if (!s.ok()) {
      *err = s;
      return 0;
    }
    runs.push_back(dt);
    total += dt;
  }
  std::nth_element(runs.begin(), runs.begin() + runs.size() / 2, runs.end());
  return runs[runs.size() / 2];
}

// Target from docs/benchmarks.md: minimum fraction of memcpy throughput, or nullopt.
struct Target {
  double encode = 0;
  double decode = 0;
};
std::optional<Target> TargetFor(absl::string_view spec) {
  const absl::string_view name = spec.substr(0, spec.find(':'));
  for (absl::string_view n : {"fp16", "bf16", "int8", "sign", "terngrad", "natural"}) {
    if (name == n) return Target{0.5, 0.5};
  }
  for (absl::string_view n : {"topk", "dgc", "stc", "qsgd"}) {
    if (name == n) return Target{0.2, 0};
  }
  return std::nullopt;
}

std::string HumanSize(uint64_t n) {
  if (n % (1u << 20) == 0) return absl::StrCat(n >> 20, "M");
  if (n % (1u << 10) == 0) return absl::StrCat(n >> 10, "K");
  return absl::StrCat(n);
}

}  // namespace

std::vector<std::string> DefaultBenchSpecs() {
  return {"none",
          "fp16",
          "bf16",
          "int8",
          "int8:round=stochastic",
          "topk:ratio=0.01",
          "dgc:ratio=0.01",
          "dgc:ratio=0.001",
          "randomk:ratio=0.01",
          "threshold:tau=2.5",
          "dct:ratio=0.01,every=10",
          "terngrad",
          "terngrad:pack=base3",
          "qsgd:levels=16",
          "sign",
          "natural",
          "natural-dither:levels=8",
          "stc:ratio=0.01",
          "powersgd:rank=4",
          "hq:ratio=0.1,bits=6-4-3-2"};
}

absl::Status RunBenchCodecs(const BenchCodecsOptions& options) {
  auto registry = NewBuiltinCodecRegistry();
  std::unique_ptr<ThreadPool> pool;
  if (options.threads > 1) pool = std::make_unique<ThreadPool>(options.threads - 1);
  std::ofstream json;
  if (!options.json_path.empty()) {
    json.open(options.json_path);
    if (!json) return absl::InvalidArgumentError(absl::StrCat("cannot write ", options.json_path));
  }
  std::printf(
      "tern bench codecs: %d thread(s), input N(0,1) float32, GB/s of fp32 input, "
      "median of >= 3 runs\n",
      options.threads);
  int misses = 0, checked = 0;
  for (uint64_t d : options.sizes) {
    std::vector<float> x(d), out(d);
    const RngKey key = MakeRngKey(42);
    for (uint64_t i = 0; i < d; ++i) x[i] = Normal(key, i);
    std::memset(out.data(), 0, d * sizeof(float));  // fault the pages in before timing
    absl::Status err;
    const double t_memcpy = TimeMedian(
        options.min_seconds,
        [&] {
          std::memcpy(out.data(), x.data(), d * sizeof(float));
          return absl::OkStatus();
        },
        &err);
    const double gb = 4.0 * d / 1e9;
    const double memcpy_gbs = gb / t_memcpy;
    std::printf("\n%s floats (%.0f MB): memcpy %.2f GB/s\n", HumanSize(d).c_str(), gb * 1e3,
                memcpy_gbs);
    std::printf("%-24s %9s %8s %9s %8s %9s %10s %9s  %s\n", "codec", "enc GB/s", "enc/mem",
                "dec GB/s", "dec/mem", "ratio", "bits/coord", "rel.err", "target");
    for (const std::string& spec : options.specs) {
      TERN_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, registry->Create(spec));
      // PowerSGD sees a square-ish matrix; the others a flat vector.
      const int64_t rows = int64_t{1} << (std::bit_width(d) / 2);
      const int64_t shape[2] = {rows, static_cast<int64_t>(d) / rows};
      EncodeOptions eo;
      eo.seed = 7;
      eo.pool = pool.get();
      if (absl::StartsWith(spec, "powersgd") && d % rows == 0) eo.shape = shape;
      EncodedTensor enc;
      TERN_RETURN_IF_ERROR(codec->Encode(x, eo, &enc));  // warm-up; sizes the payload buffer
      const double t_enc = TimeMedian(
          options.min_seconds, [&] { return codec->Encode(x, eo, &enc); }, &err);
      TERN_RETURN_IF_ERROR(err);
      const EncodedView view = EncodedView::Of(enc);
      const double t_dec = TimeMedian(
          options.min_seconds, [&] { return codec->Decode(view, absl::MakeSpan(out), pool.get()); },
          &err);
      TERN_RETURN_IF_ERROR(err);
      double num = 0, den = 0;
      for (uint64_t i = 0; i < d; ++i) {
        num += double(out[i] - x[i]) * (out[i] - x[i]);
        den += double(x[i]) * x[i];
      }
      const double bytes = static_cast<double>(enc.ByteSize());
      const double enc_ratio = gb / t_enc / memcpy_gbs, dec_ratio = gb / t_dec / memcpy_gbs;
      std::string verdict = "-";
      if (auto target = TargetFor(spec); target && options.threads == 1) {
        const bool ok = enc_ratio >= target->encode && dec_ratio >= target->decode;
        ++checked;
        misses += ok ? 0 : 1;
        verdict =
            target->decode > 0
                ? absl::StrFormat("%s (enc,dec >= %.1fx)", ok ? "PASS" : "MISS", target->encode)
                : absl::StrFormat("%s (enc >= %.1fx)", ok ? "PASS" : "MISS", target->encode);
      }
      std::printf("%-24s %9.2f %7.2fx %9.2f %7.2fx %8.1fx %10.3f %9.2e  %s\n", spec.c_str(),
                  gb / t_enc, enc_ratio, gb / t_dec, dec_ratio, 4.0 * d / bytes, 8 * bytes / d,
                  std::sqrt(num / den), verdict.c_str());
      if (json.is_open()) {
        v1::CodecBenchRow row;
        row.set_size(static_cast<int32_t>(d));
        row.set_codec(spec);
        row.set_threads(options.threads);
        row.set_memcpy_gbs(memcpy_gbs);
        row.set_encode_gbs(gb / t_enc);
        row.set_decode_gbs(gb / t_dec);
        row.set_encode_vs_memcpy(enc_ratio);
        row.set_decode_vs_memcpy(dec_ratio);
        row.set_compression(4.0 * d / bytes);
        row.set_bits_per_coord(8 * bytes / d);
        row.set_rel_error(std::sqrt(num / den));
        json << ToJsonLine(row);
      }
    }
  }
  if (checked > 0) {
    std::printf("\ntargets: %d of %d rows met (single thread; see docs/benchmarks.md)\n",
                checked - misses, checked);
  }
  return absl::OkStatus();
}

}  // namespace tern
