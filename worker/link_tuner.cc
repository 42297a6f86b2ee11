#include "worker/link_tuner.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tern {

absl::StatusOr<std::unique_ptr<LinkTuner>> LinkTuner::Create(LinkTunerOptions options,
                                                             const CodecRegistry& codecs) {
  if (options.codecs.empty()) return absl::InvalidArgumentError("--codec_ladder: no codecs");
  if (!(options.cu_target > 0 && options.cu_target < 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--cu_target=%g: a share of the step's time, in (0, 1)", options.cu_target));
  }
  const auto start = std::find(options.codecs.begin(), options.codecs.end(), options.start);
  if (start == options.codecs.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--codec=%s is not on --codec_ladder=%s: the ladder starts from it",
                        options.start, absl::StrJoin(options.codecs, ",")));
  }
  // Each rung's bytes a value, from a probe as large as a block of any codec's scale.
  constexpr size_t kProbe = 1 << 16;
  std::vector<float> probe(kProbe);
  for (size_t i = 0; i < kProbe; ++i) probe[i] = static_cast<float>(i % 97) * 1e-3f - 0.05f;
  std::vector<double> bytes_per_value;
  for (const std::string& spec : options.codecs) {
    absl::StatusOr<std::unique_ptr<Codec>> codec = codecs.Create(spec);
    if (!codec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--codec_ladder: ", spec, ": ", codec.status().message()));
    }
    EncodedTensor t;
    if (absl::Status s = (*codec)->Encode(probe, EncodeOptions(), &t); !s.ok()) return s;
    bytes_per_value.push_back(static_cast<double>(t.ByteSize()) / kProbe);
    if (bytes_per_value.size() > 1 &&
        bytes_per_value.back() >= bytes_per_value[bytes_per_value.size() - 2]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--codec_ladder: %s (%.2f bytes a value) is not narrower than the codec before it; "
          "list the codecs widest first",
          spec, bytes_per_value.back()));
    }
  }
  const size_t rung = static_cast<size_t>(start - options.codecs.begin());
  return absl::WrapUnique(new LinkTuner(std::move(options), std::move(bytes_per_value), rung));
}

void LinkTuner::ObserveStep(double step_seconds, double wait_seconds) {
  absl::MutexLock lock(&mu_);
  measured_.AddStep(step_seconds, wait_seconds);
}

void LinkTuner::ObserveExchange(uint64_t bytes, double push_seconds) {
  absl::MutexLock lock(&mu_);
  measured_.AddExchange(static_cast<double>(bytes), push_seconds);
}

std::optional<LinkTuner::Change> LinkTuner::Decide() {
  absl::MutexLock lock(&mu_);
  if (!measured_.Full(window_)) return std::nullopt;
  const LinkWindow w = measured_;
  measured_ = LinkWindow();
  const double cu = w.cu();
  const double compute = w.compute();
  const double exchanges_a_step =
      static_cast<double>(w.exchanges + w.unmeasured) / static_cast<double>(w.steps);
  const double push = w.push();
  const double bytes = w.update_bytes();
  state_.cu = cu;
  state_.push_seconds = push;
  state_.megabytes_per_second = push > 0 ? bytes / push / 1e6 : 0;
  if (w.exchanges == 0) return std::nullopt;
  // An exchange hides behind overlap_steps steps of compute; what it takes beyond that is waited.
  const double hidden = options_.overlap_steps * compute;
  const auto cu_with = [&](double push_time) {
    const double wait = std::max(0.0, push_time - hidden) * exchanges_a_step;
    return compute / (compute + wait);
  };
  const double target = options_.cu_target;
  const std::string& from = options_.codecs[rung_];
  if (cu < target && push > hidden && rung_ + 1 < options_.codecs.size()) {
    // Not tried again for 1, 2, 4, ... windows each time it proves too slow (up to 64).
    held_[rung_] = 1 << std::min(holds_[rung_]++, 6);
    ++rung_;
    ++state_.changes;
    state_.codec = options_.codecs[rung_];
    return Change{state_.codec,
                  absl::StrFormat("compute utilization %.0f%% < %.0f%%: an update of %.2f MB in "
                                  "%s took %.3f s to push, %.3f s of compute overlap it",
                                  100 * cu, 100 * target, bytes / 1e6, from, push, hidden)};
  }
  if (rung_ > 0 && held_[rung_ - 1] > 0) {
    --held_[rung_ - 1];
  } else if (rung_ > 0) {
    const double ratio = bytes_per_value_[rung_ - 1] / bytes_per_value_[rung_];
    const double predicted = cu_with(push * ratio);
    if (predicted >= target) {
      --rung_;
      ++state_.changes;
      state_.codec = options_.codecs[rung_];
      return Change{state_.codec,
                    absl::StrFormat("the link carried %.2f MB in %.3f s: %.2f MB in %s would keep "
                                    "compute utilization at %.0f%% >= %.0f%%",
                                    bytes / 1e6, push, bytes * ratio / 1e6, state_.codec,
                                    100 * predicted, 100 * target)};
    }
  }
  return std::nullopt;
}

LinkState LinkTuner::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

}  // namespace tern
