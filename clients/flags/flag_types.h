// Numeric flags that carry their range in their type, so the range is written where the flag is
// defined and a value outside it does not even parse: `tern COMMAND --name=V` is refused before
// anything starts (cli/command_table.h CheckValueSyntax; absl's own parse of a --flagfile alike),
// and the message states the range.
//
//   ABSL_FLAG(tern::Int<tern::AtLeast(1)>, workers, 4, "run: how many workers");
//   ABSL_FLAG(tern::Double<tern::HalfOpen(0, 1)>, momentum, 0.9, "...");
//
// Declare such a flag once, in the header its defining file includes (clients/flags/train_flags.h):
// the range is part of the type, and only there does the compiler hold a declaration to the
// definition (a variable's link name does not carry its type).
//
// A flag's value converts to its number (`int n = absl::GetFlag(FLAGS_workers).value;`); where a
// template needs the type itself, take `.value`. Numbers any value of which is good (a seed)
// stay plain; `tern help` refuses any other plain number (CheckTable).
//
// Thread-safety: values; the functions are pure.
#ifndef TERN_CLIENTS_FLAGS_FLAG_TYPES_H_
#define TERN_CLIENTS_FLAGS_FLAG_TYPES_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tern {

// [min, max], either end open; no max: unbounded above.
struct Range {
  double min = 0, max = 0;
  bool min_open = false, max_open = false, has_max = true;

  constexpr bool Holds(double v) const {
    return (min_open ? v > min : v >= min) && (!has_max || (max_open ? v < max : v <= max));
  }
  std::string Says() const {
    if (!has_max) return absl::StrCat(min_open ? "> " : ">= ", Number(min));
    return absl::StrCat("in ", min_open ? "(" : "[", Number(min), ", ", Number(max),
                        max_open ? ")" : "]");
  }
  // A whole bound as digits ("1048576", not StrCat's "1.04858e+06").
  static std::string Number(double v) {
    if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
    return absl::StrCat(v);
  }
};
constexpr Range AtLeast(double min) { return {min, 0, false, false, false}; }
constexpr Range Above(double min) { return {min, 0, true, false, false}; }
constexpr Range In(double min, double max) { return {min, max}; }
constexpr Range HalfOpen(double min, double max) { return {min, max, false, true}; }   // [min, max)
constexpr Range AboveUpTo(double min, double max) { return {min, max, true, false}; }  // (min, max]
constexpr Range Open(double min, double max) { return {min, max, true, true}; }        // (min, max)

template <typename T, Range R>
struct Ranged {
  T value{};
  constexpr Ranged() = default;
  constexpr Ranged(T v) : value(v) {}  // NOLINT: a flag's default and SetFlag take the number
  constexpr operator T() const { return value; }  // NOLINT
  static constexpr Range kRange = R;
};

template <typename T, Range R>
bool AbslParseFlag(absl::string_view text, Ranged<T, R>* out, std::string* error) {
  T v;
  bool parsed;
  if constexpr (std::is_floating_point_v<T>) {
    parsed = absl::SimpleAtod(text, &v) && std::isfinite(v);
  } else {
    parsed = absl::SimpleAtoi(text, &v);
  }
  if (!parsed) {
    *error = std::is_floating_point_v<T> ? "not a number" : "not a whole number";
    return false;
  }
  if (!R.Holds(static_cast<double>(v))) {
    *error = absl::StrCat("must be ", R.Says());
    return false;
  }
  out->value = v;
  return true;
}

template <typename T, Range R>
std::string AbslUnparseFlag(Ranged<T, R> v) {
  return absl::StrCat(v.value);
}

template <Range R>
using Int = Ranged<int, R>;
template <Range R>
using Int64 = Ranged<int64_t, R>;
template <Range R>
using Uint64 = Ranged<uint64_t, R>;
template <Range R>
using Double = Ranged<double, R>;

}  // namespace tern

#endif  // TERN_CLIENTS_FLAGS_FLAG_TYPES_H_
