// Run folders (metrics.jsonl + run.json written by `tern run`) and their self-contained HTML
// report: inline SVG charts, no scripts or downloads, so it opens anywhere.
#ifndef TERN_CLI_REPORT_H_
#define TERN_CLI_REPORT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tern {

// A flat JSON object's members: numbers (and booleans as 0/1) in `numbers`, strings in `strings`.
struct FlatJson {
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> strings;
  double Num(const std::string& key, double fallback = 0) const {
    auto it = numbers.find(key);
    return it == numbers.end() ? fallback : it->second;
  }
};
// Parses one flat JSON object (no nested objects or arrays).
absl::StatusOr<FlatJson> ParseFlatJson(absl::string_view text);
std::string JsonEscape(absl::string_view s);

struct RunSeries {
  std::string name;
  FlatJson config;             // run.json
  std::vector<FlatJson> rows;  // metrics.jsonl, one per evaluation
};
absl::StatusOr<RunSeries> LoadRun(const std::string& dir);

// The HTML page comparing `runs` (one is fine).
std::string RenderReport(const std::vector<RunSeries>& runs);

}  // namespace tern

#endif  // TERN_CLI_REPORT_H_
