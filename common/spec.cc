#include "common/spec.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tern {
namespace {

bool ValidToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-' &&
        c != '+') {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::pair<std::string, SpecParams>> SpecParams::ParseSpec(absl::string_view spec) {
  absl::string_view name = spec, rest;
  if (size_t colon = spec.find(':'); colon != absl::string_view::npos) {
    name = spec.substr(0, colon);
    rest = spec.substr(colon + 1);
  }
  if (!ValidToken(name)) {
    return absl::InvalidArgumentError(absl::StrCat("bad codec name in spec '", spec, "'"));
  }
  SpecParams params;
  if (!rest.empty()) {
    for (absl::string_view kv : absl::StrSplit(rest, ',')) {
      std::pair<absl::string_view, absl::string_view> p =
          absl::StrSplit(kv, absl::MaxSplits('=', 1));
      if (!ValidToken(p.first) || !ValidToken(p.second)) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad parameter '", kv, "' in spec '", spec, "' (want key=value)"));
      }
      if (!params.values_.emplace(std::string(p.first), std::string(p.second)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter '", p.first, "' given twice in spec '", spec, "'"));
      }
    }
  } else if (spec.size() > name.size()) {
    return absl::InvalidArgumentError(absl::StrCat("empty parameter list in spec '", spec, "'"));
  }
  return std::make_pair(std::string(name), std::move(params));
}

absl::StatusOr<double> SpecParams::Double(absl::string_view key, double default_value, double min,
                                          double max) {
  auto it = values_.find(key);
  if (it == values_.end()) return default_value;
  used_.emplace(key);
  double v;
  if (!absl::SimpleAtod(it->second, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", key, "=", it->second, " is not a number"));
  }
  if (v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", key, "=", it->second, " is outside [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<int64_t> SpecParams::Int(absl::string_view key, int64_t default_value, int64_t min,
                                        int64_t max) {
  auto it = values_.find(key);
  if (it == values_.end()) return default_value;
  used_.emplace(key);
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", key, "=", it->second, " is not an integer"));
  }
  if (v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", key, "=", it->second, " is outside [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<bool> SpecParams::Bool(absl::string_view key, bool default_value) {
  auto it = values_.find(key);
  if (it == values_.end()) return default_value;
  used_.emplace(key);
  bool v;
  if (!absl::SimpleAtob(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", key, "=", it->second, " is not a boolean (0/1/true/false)"));
  }
  return v;
}

std::string SpecParams::String(absl::string_view key, absl::string_view default_value) {
  auto it = values_.find(key);
  if (it == values_.end()) return std::string(default_value);
  used_.emplace(key);
  return it->second;
}

absl::StatusOr<std::string> SpecParams::Enum(absl::string_view key, absl::string_view default_value,
                                             std::initializer_list<absl::string_view> allowed) {
  auto it = values_.find(key);
  if (it == values_.end()) return std::string(default_value);
  used_.emplace(key);
  for (absl::string_view a : allowed) {
    if (a == it->second) return it->second;
  }
  return absl::InvalidArgumentError(absl::StrCat("parameter ", key, "=", it->second,
                                                 " must be one of ", absl::StrJoin(allowed, "|")));
}

absl::Status SpecParams::CheckAllUsed(absl::string_view what) const {
  std::vector<absl::string_view> unknown;
  for (const auto& [k, v] : values_) {
    if (!used_.contains(k)) unknown.push_back(k);
  }
  if (unknown.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown parameter(s) ", absl::StrJoin(unknown, ", "), " for ", what));
}

}  // namespace tern
