// A built-in client that lies, for experiments with the aggregator's robust rules and norm guard
// (docs/robustness.md): it trains as usual, then replaces its honest update before encoding it.
//
//   signflip[:scale=S]   -S * u        (S = 1)
//   scale:factor=F       F * u
//   noise:std=D          Gaussian noise of standard deviation D, nothing of u
//   nan                  every value NaN
//
// Thread-safety: plain functions and a value type.
#ifndef TERN_CLIENTS_CPP_ATTACK_H_
#define TERN_CLIENTS_CPP_ATTACK_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tern {

struct Attack {
  enum class Kind { kNone, kSignFlip, kScale, kNoise, kNaN };
  Kind kind = Kind::kNone;
  double value = 1;  // the scale, factor or standard deviation
};

// "" or "none" is no attack; anything unknown is InvalidArgument naming the forms.
absl::StatusOr<Attack> ParseAttack(absl::string_view spec);

// Whether client `index` of `clients` is one of the first round(fraction * clients).
bool IsAttacker(int index, int clients, double fraction);

// Overwrites `update` with the attack's (noise drawn from `seed`).
void ApplyAttack(const Attack& attack, uint64_t seed, absl::Span<float> update);

}  // namespace tern

#endif  // TERN_CLIENTS_CPP_ATTACK_H_
