#include "cli/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/commands.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, out, "",
          "run: the run folder (default runs/<name>); report: the HTML file (default "
          "report.html)");

namespace tern {
namespace {

void SkipSpace(absl::string_view& s) { s = absl::StripLeadingAsciiWhitespace(s); }

absl::StatusOr<std::string> ParseString(absl::string_view& s) {
  if (s.empty() || s[0] != '"') return absl::InvalidArgumentError("expected a string");
  std::string out;
  size_t i = 1;
  for (; i < s.size() && s[i] != '"'; ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      ++i;
      switch (s[i]) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'u':
          out += '?';
          i = std::min(s.size() - 1, i + 4);
          break;
        default:
          out += s[i];
      }
    } else {
      out += s[i];
    }
  }
  if (i >= s.size()) return absl::InvalidArgumentError("unterminated string");
  s.remove_prefix(i + 1);
  return out;
}

}  // namespace

std::string JsonEscape(absl::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out;
}

absl::StatusOr<FlatJson> ParseFlatJson(absl::string_view s) {
  FlatJson out;
  SkipSpace(s);
  if (s.empty() || s[0] != '{') return absl::InvalidArgumentError("expected '{'");
  s.remove_prefix(1);
  SkipSpace(s);
  if (!s.empty() && s[0] == '}') return out;
  while (true) {
    SkipSpace(s);
    TERN_ASSIGN_OR_RETURN(std::string key, ParseString(s));
    SkipSpace(s);
    if (s.empty() || s[0] != ':') return absl::InvalidArgumentError("expected ':'");
    s.remove_prefix(1);
    SkipSpace(s);
    if (!s.empty() && s[0] == '"') {
      TERN_ASSIGN_OR_RETURN(out.strings[key], ParseString(s));
    } else {
      size_t end = s.find_first_of(",}");
      if (end == s.npos) return absl::InvalidArgumentError("unterminated value");
      absl::string_view v = absl::StripAsciiWhitespace(s.substr(0, end));
      double d = 0;
      if (v == "true") {
        d = 1;
      } else if (v == "false" || v == "null") {
        d = 0;
      } else if (!absl::SimpleAtod(v, &d)) {
        return absl::InvalidArgumentError(absl::StrCat("bad value '", v, "'"));
      }
      out.numbers[key] = d;
      s.remove_prefix(end);
    }
    SkipSpace(s);
    if (s.empty()) return absl::InvalidArgumentError("unterminated object");
    if (s[0] == '}') return out;
    if (s[0] != ',') return absl::InvalidArgumentError("expected ','");
    s.remove_prefix(1);
  }
}

absl::StatusOr<RunSeries> LoadRun(const std::string& dir) {
  RunSeries run;
  std::ifstream cfg(dir + "/run.json");
  if (!cfg) return absl::NotFoundError(absl::StrCat(dir, "/run.json not found"));
  std::stringstream ss;
  ss << cfg.rdbuf();
  TERN_ASSIGN_OR_RETURN(run.config, ParseFlatJson(ss.str()));
  run.name = run.config.strings.count("name") ? run.config.strings["name"] : dir;
  std::ifstream metrics(dir + "/metrics.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(metrics, line)) {
    ++n;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    auto row = ParseFlatJson(line);
    if (!row.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/metrics.jsonl line ", n, ": ", row.status().message()));
    }
    run.rows.push_back(*std::move(row));
  }
  return run;
}

namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string Html(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A "nice" tick step for a range.
double TickStep(double range) {
  if (!(range > 0)) return 1;
  const double raw = range / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return mag * (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10);
}

std::string Chart(const std::vector<RunSeries>& runs, const std::string& x_key,
                  const std::string& x_label, const std::string& y_key, const std::string& y_label,
                  double y_scale) {
  constexpr double W = 560, H = 320, L = 60, R = 20, T = 20, B = 45;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const RunSeries& r : runs) {
    for (const FlatJson& row : r.rows) {
      if (!row.numbers.count(x_key) || !row.numbers.count(y_key)) continue;
      x0 = std::min(x0, row.Num(x_key));
      x1 = std::max(x1, row.Num(x_key));
      y0 = std::min(y0, row.Num(y_key) * y_scale);
      y1 = std::max(y1, row.Num(y_key) * y_scale);
    }
  }
  if (x0 > x1) return "<p>(no data)</p>";
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  x0 = std::min(x0, 0.0);
  const double ys = TickStep(y1 - y0);
  y0 = std::floor(y0 / ys) * ys;
  y1 = std::ceil(y1 / ys) * ys;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  std::string svg = absl::StrFormat(
      "<svg xmlns='http://www.w3.org/2000/svg' width='%g' height='%g' "
      "font-family='sans-serif' font-size='11'>",
      W, H);
  // Axes and grid.
  for (double y = y0; y <= y1 + ys / 2; y += ys) {
    absl::StrAppendFormat(&svg,
                          "<line x1='%g' y1='%.1f' x2='%g' y2='%.1f' stroke='#ddd'/>"
                          "<text x='%g' y='%.1f' text-anchor='end'>%g</text>",
                          L, py(y), W - R, py(y), L - 4, py(y) + 4, y);
  }
  const double xs = TickStep(x1 - x0);
  for (double x = std::ceil(x0 / xs) * xs; x <= x1 + xs / 2; x += xs) {
    absl::StrAppendFormat(&svg,
                          "<line x1='%.1f' y1='%g' x2='%.1f' y2='%g' stroke='#eee'/>"
                          "<text x='%.1f' y='%g' text-anchor='middle'>%g</text>",
                          px(x), T, px(x), H - B, px(x), H - B + 14, x);
  }
  absl::StrAppendFormat(&svg,
                        "<rect x='%g' y='%g' width='%g' height='%g' fill='none' stroke='#888'/>"
                        "<text x='%g' y='%g' text-anchor='middle'>%s</text>"
                        "<text transform='translate(14,%g) rotate(-90)' "
                        "text-anchor='middle'>%s</text>",
                        L, T, W - L - R, H - T - B, (L + W - R) / 2, H - 8, Html(x_label),
                        (T + H - B) / 2, Html(y_label));
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string pts;
    for (const FlatJson& row : runs[i].rows) {
      if (!row.numbers.count(x_key) || !row.numbers.count(y_key)) continue;
      absl::StrAppendFormat(&pts, "%.1f,%.1f ", px(row.Num(x_key)), py(row.Num(y_key) * y_scale));
    }
    const char* color = kColors[i % 10];
    absl::StrAppendFormat(&svg, "<polyline points='%s' fill='none' stroke='%s' stroke-width='2'/>",
                          pts, color);
    absl::StrAppendFormat(&svg,
                          "<rect x='%g' y='%g' width='10' height='10' fill='%s'/>"
                          "<text x='%g' y='%g'>%s</text>",
                          L + 10, T + 8 + 14 * static_cast<double>(i), color, L + 24,
                          T + 17 + 14 * static_cast<double>(i), Html(runs[i].name));
  }
  svg += "</svg>";
  return svg;
}

}  // namespace

std::string RenderReport(const std::vector<RunSeries>& runs) {
  std::string h =
      "<!doctype html><html><head><meta charset='utf-8'><title>tern report</title><style>"
      "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse}"
      "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}"
      "td:first-child{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:12px}"
      "</style></head><body><h1>tern training report</h1>";
  h += "<table><tr><th>run</th><th>algorithm</th><th>codec</th><th>topology</th><th>workers</th>"
       "<th>steps</th><th>final test acc</th><th>best test acc</th><th>MB sent / worker</th>"
       "<th>compression vs dense</th><th>wall s</th></tr>";
  for (const RunSeries& r : runs) {
    double best = 0;
    for (const FlatJson& row : r.rows) best = std::max(best, row.Num("test_acc"));
    const FlatJson empty;
    const FlatJson& last = r.rows.empty() ? empty : r.rows.back();
    auto str = [&](const char* k) {
      auto it = r.config.strings.find(k);
      return Html(it == r.config.strings.end() ? "" : it->second);
    };
    absl::StrAppendFormat(
        &h,
        "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%g</td><td>%g</td>"
        "<td>%.2f %%</td><td>%.2f %%</td><td>%.2f</td><td>%.1f×</td><td>%.1f</td></tr>",
        Html(r.name), str("algorithm"), str("codec"), str("topology"), r.config.Num("workers"),
        last.Num("step"), 100 * last.Num("test_acc"), 100 * best, last.Num("mb_sent_per_worker"),
        last.Num("compression"), last.Num("wall_s"));
  }
  h += "</table><div class='charts'>";
  h += Chart(runs, "step", "round", "test_acc", "test accuracy (%)", 100);
  h +=
      Chart(runs, "mb_sent_per_worker", "MB sent per worker", "test_acc", "test accuracy (%)", 100);
  h += Chart(runs, "wall_s", "wall time (s)", "test_acc", "test accuracy (%)", 100);
  h += Chart(runs, "step", "round", "train_loss", "training loss", 1);
  h += Chart(runs, "step", "round", "consensus", "consensus distance", 1);
  h += "</div><h2>Configurations</h2>";
  for (const RunSeries& r : runs) {
    h += "<h3>" + Html(r.name) + "</h3><pre>";
    for (const auto& [k, v] : r.config.strings) h += Html(k) + " = " + Html(v) + "\n";
    for (const auto& [k, v] : r.config.numbers) h += absl::StrFormat("%s = %g\n", Html(k), v);
    h += "</pre>";
  }
  h += "</body></html>\n";
  return h;
}

int ReportMain(const std::vector<std::string>& args) {
  std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) out = "report.html";
  std::vector<RunSeries> runs;
  for (const std::string& a : args) {
    auto run = LoadRun(a);
    if (!run.ok()) {
      std::fprintf(stderr, "tern report: %s\n", run.status().ToString().c_str());
      return 1;
    }
    runs.push_back(*std::move(run));
  }
  if (runs.empty()) {
    std::fprintf(stderr, "usage: tern report RUN_DIR... [--out=FILE.html]\n");
    return 2;
  }
  std::ofstream f(out);
  f << RenderReport(runs);
  if (!f) {
    std::fprintf(stderr, "tern report: cannot write %s\n", out.c_str());
    return 1;
  }
  std::printf("wrote %s (%zu runs)\n", out.c_str(), runs.size());
  return 0;
}

}  // namespace tern
