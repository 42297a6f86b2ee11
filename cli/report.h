// Run folders (run.json + metrics.jsonl written by `tern run`, as the records of
// proto/tern/v1/records.proto) and their self-contained HTML report: inline SVG charts, no
// scripts or downloads, so it opens anywhere.
#ifndef TERN_CLI_REPORT_H_
#define TERN_CLI_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tern/v1/records.pb.h"

namespace tern {

struct RunSeries {
  std::string name;  // the run folder's name
  v1::RunConfig config;
  std::vector<v1::MetricsRow> rows;  // one per evaluation
};
absl::StatusOr<RunSeries> LoadRun(const std::string& dir);

// The run folder: --out, or runs/<name>-<time>; created if needed. "" (after printing why) when
// it cannot be.
std::string MakeRunDir(const std::string& name);

// The HTML page comparing `runs` (one is fine).
std::string RenderReport(const std::vector<RunSeries>& runs);

}  // namespace tern

#endif  // TERN_CLI_REPORT_H_
