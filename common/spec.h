// Parsing of spec strings (codecs, topologies, algorithms, aggregation rules): "name" or
// "name:key=value,key=value". Factories read their
// parameters through typed getters with ranges; any key a factory did not read is an error, so a
// typo ("ratoi=0.01") never silently falls back to a default.
//
// Thread-safety: not thread-safe (getters record which keys were used).
#ifndef TERN_COMMON_SPEC_H_
#define TERN_COMMON_SPEC_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tern {

class SpecParams {
 public:
  SpecParams() = default;

  // Splits "name:k=v,..." into the name and its parameters. Rejects empty keys, duplicate keys and
  // characters outside [A-Za-z0-9_.+-].
  static absl::StatusOr<std::pair<std::string, SpecParams>> ParseSpec(absl::string_view spec);

  absl::StatusOr<double> Double(absl::string_view key, double default_value, double min,
                                double max);
  absl::StatusOr<int64_t> Int(absl::string_view key, int64_t default_value, int64_t min,
                              int64_t max);
  absl::StatusOr<bool> Bool(absl::string_view key, bool default_value);
  // Any value (already restricted to the spec's character set); the caller validates it.
  std::string String(absl::string_view key, absl::string_view default_value);
  absl::StatusOr<std::string> Enum(absl::string_view key, absl::string_view default_value,
                                   std::initializer_list<absl::string_view> allowed);

  // Error naming every key no getter asked for, and `what` they were given to ("codec 'stc'").
  absl::Status CheckAllUsed(absl::string_view what) const;

 private:
  std::map<std::string, std::string, std::less<>> values_;
  std::set<std::string, std::less<>> used_;
};

}  // namespace tern

#endif  // TERN_COMMON_SPEC_H_
