#include "clients/cpp/attack.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rng.h"

namespace tern {
namespace {

absl::Status Bad(absl::string_view spec) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--attack=", spec, ": want none, signflip[:scale=S], scale:factor=F, noise:std=D or nan"));
}

}  // namespace

absl::StatusOr<Attack> ParseAttack(absl::string_view spec) {
  Attack a;
  if (spec.empty() || spec == "none") return a;
  const std::vector<absl::string_view> p = absl::StrSplit(spec, absl::MaxSplits(':', 1));
  std::string key;
  if (p[0] == "signflip") {
    a.kind = Attack::Kind::kSignFlip;
    key = "scale";
  } else if (p[0] == "scale") {
    a.kind = Attack::Kind::kScale;
    key = "factor";
  } else if (p[0] == "noise") {
    a.kind = Attack::Kind::kNoise;
    key = "std";
  } else if (p[0] == "nan" && p.size() == 1) {
    a.kind = Attack::Kind::kNaN;
    return a;
  } else {
    return Bad(spec);
  }
  if (p.size() == 1) {
    if (a.kind == Attack::Kind::kSignFlip) return a;
    return Bad(spec);
  }
  const std::vector<absl::string_view> kv = absl::StrSplit(p[1], absl::MaxSplits('=', 1));
  if (kv.size() != 2 || kv[0] != key || !absl::SimpleAtod(kv[1], &a.value) ||
      !std::isfinite(a.value) || a.value < 0) {
    return Bad(spec);
  }
  return a;
}

bool IsAttacker(int index, int clients, double fraction) {
  return index < static_cast<int>(std::lround(fraction * clients));
}

void ApplyAttack(const Attack& attack, uint64_t seed, absl::Span<float> update) {
  const float v = static_cast<float>(attack.value);
  switch (attack.kind) {
    case Attack::Kind::kNone:
      return;
    case Attack::Kind::kSignFlip:
      for (float& x : update) x *= -v;
      return;
    case Attack::Kind::kScale:
      for (float& x : update) x *= v;
      return;
    case Attack::Kind::kNoise: {
      const RngKey key = MakeRngKey(seed);
      for (size_t i = 0; i < update.size(); ++i) update[i] = v * Normal(key, i);
      return;
    }
    case Attack::Kind::kNaN:
      for (float& x : update) x = std::numeric_limits<float>::quiet_NaN();
      return;
  }
}

}  // namespace tern
