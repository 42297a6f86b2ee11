#include "cli/report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "common/file_util.h"
#include "common/json_lines.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"

ABSL_FLAG(std::string, out, "",
          "run: the run folder (default runs/<name>); report: the HTML file (default "
          "report.html); certs, tokens: the folder; export: FILE.npz or FILE.pt");

namespace tern {

std::string MakeRunDir(const std::string& name) {
  std::string dir = absl::GetFlag(FLAGS_out);
  if (dir.empty()) {
    dir = absl::StrCat("runs/", name, "-",
                       absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()));
    (void)MakeDirectory("runs");  // the next call says what went wrong
  }
  if (absl::Status s = MakeDirectory(dir); !s.ok()) {
    std::fprintf(stderr, "tern run: %s\n", std::string(s.message()).c_str());
    return "";
  }
  return dir;
}

absl::StatusOr<RunSeries> LoadRun(const std::string& dir) {
  RunSeries run;
  std::ifstream cfg(dir + "/run.json");
  if (!cfg) return absl::NotFoundError(absl::StrCat(dir, "/run.json not found"));
  std::stringstream ss;
  ss << cfg.rdbuf();
  if (absl::Status s = FromJson(ss.str(), &run.config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/run.json: ", s.message()));
  }
  // Runs are labelled by their folder: that is what the user named and compares.
  std::string base(absl::StripSuffix(dir, "/"));
  run.name = base.substr(base.find_last_of('/') + 1);
  std::ifstream metrics(dir + "/metrics.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(metrics, line)) {
    ++n;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    v1::MetricsRow row;
    if (absl::Status s = FromJson(line, &row); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/metrics.jsonl line ", n, ": ", s.message()));
    }
    run.rows.push_back(std::move(row));
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

// A numeric field of `m` by name, when it was recorded.
std::optional<double> Field(const google::protobuf::Message& m, const std::string& name) {
  const google::protobuf::FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(name);
  const google::protobuf::Reflection* r = m.GetReflection();
  if (f == nullptr || f->is_repeated() || !r->HasField(m, f)) return std::nullopt;
  switch (f->cpp_type()) {
    case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE:
      return r->GetDouble(m, f);
    case google::protobuf::FieldDescriptor::CPPTYPE_FLOAT:
      return r->GetFloat(m, f);
    case google::protobuf::FieldDescriptor::CPPTYPE_INT32:
      return r->GetInt32(m, f);
    case google::protobuf::FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(m, f) ? 1.0 : 0.0;
    default:
      return std::nullopt;
  }
}

// A "nice" tick step for a range.
double TickStep(double range) {
  if (!(range > 0)) return 1;
  const double raw = range / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return mag * (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10);
}

// A tick label short enough for the margin: "1200", "0.05", "1e-04".
std::string TickLabel(double v) {
  if (std::abs(v) < 1e-12) return "0";
  return absl::StrFormat("%.4g", v);
}

bool IsAggregatorRun(const RunSeries& r) {
  return r.config.has_mode() && r.config.mode() != "gossip";
}

// Which runs a chart draws: a gossip run's steps and an aggregator's rounds are not one axis.
enum class RunKind { kAny, kGossip, kAggregator };

struct ChartSpec {
  std::string x_key, x_label, y_key, y_label;
  double y_scale = 1;
  bool log_y = false;
  bool log_x = false;
  RunKind runs = RunKind::kAny;
  std::string caption_note = "";  // after the caption: "(gossip runs)"
};

struct Point {
  double x, y;
};

// Each run's points of `c` (non-positive values dropped on a log scale); none for a run of a kind
// the chart does not draw.
std::vector<std::vector<Point>> Series(const std::vector<RunSeries>& runs, const ChartSpec& c) {
  std::vector<std::vector<Point>> out(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    if (c.runs != RunKind::kAny && IsAggregatorRun(runs[i]) != (c.runs == RunKind::kAggregator)) {
      continue;
    }
    for (const v1::MetricsRow& row : runs[i].rows) {
      const std::optional<double> x = Field(row, c.x_key), y = Field(row, c.y_key);
      if (!x || !y || !std::isfinite(*x) || !std::isfinite(*y)) continue;
      const double v = *y * c.y_scale;
      if ((c.log_y && !(v > 0)) || (c.log_x && !(*x > 0))) continue;
      out[i].push_back({c.log_x ? std::log10(*x) : *x, c.log_y ? std::log10(v) : v});
    }
  }
  return out;
}

// A chart's frame: data ranges rounded out to ticks, the mapping to pixels, the grid, ticks and
// axis titles. Wide margins: the longest tick label ("0.0001", "12000") and the titles fit.
struct Axes {
  static constexpr double W = 560, H = 320, L = 72, R = 28, T = 28, B = 45;
  double x0, x1, y0, y1, xs, ys;
  bool log_y, log_x;

  // On a log axis the values are log10s already (Series), and the axis runs whole decades.
  Axes(double x_lo, double x_hi, double y_lo, double y_hi, bool log, bool logx = false)
      : log_y(log), log_x(logx) {
    if (log_x) {
      x0 = std::floor(x_lo);
      x1 = std::max(std::ceil(x_hi), x0 + 1);
      xs = 1;
    } else {
      x0 = std::min(x_lo, 0.0);
      x1 = x_hi == x0 ? x0 + 1 : x_hi;
      xs = TickStep(x1 - x0);
      x1 = std::ceil(x1 / xs) * xs;  // the axis ends on a tick, so every label sits on the axis
    }
    if (y_hi == y_lo) y_hi = y_lo + 1;
    ys = log_y ? 1.0 : TickStep(y_hi - y_lo);  // decades on a log scale
    y0 = std::floor(y_lo / ys) * ys;
    y1 = std::ceil(y_hi / ys) * ys;
  }
  double px(double x) const { return L + (x - x0) / (x1 - x0) * (W - L - R); }
  double py(double y) const { return H - B - (y - y0) / (y1 - y0) * (H - T - B); }

  // The <figure> and <svg> opening, the grid with its labels and the titles.
  std::string Open(const std::string& caption, const std::string& x_label,
                   const std::string& y_label) const {
    std::string svg = absl::StrFormat(
        "<figure><figcaption>%s</figcaption><svg xmlns='http://www.w3.org/2000/svg' width='%g' "
        "height='%g' font-family='sans-serif' font-size='11'>",
        Html(caption), W, H);
    for (double y = y0; y <= y1 + ys / 2; y += ys) {
      HLine(&svg, y, "#ddd",
            log_y ? absl::StrFormat("1e%d", static_cast<int>(std::lround(y))) : TickLabel(y));
      // A log axis of few decades gets 2x and 5x ticks too, so its scale can be read.
      for (double m : {2.0, 5.0}) {
        const double ym = y + std::log10(m);
        if (log_y && y1 - y0 <= 2 && ym < y1) HLine(&svg, ym, "#eee", TickLabel(std::pow(10, ym)));
      }
    }
    for (double x = std::ceil(x0 / xs) * xs; x <= x1 + xs / 2; x += xs) {
      absl::StrAppendFormat(&svg,
                            "<line x1='%.1f' y1='%g' x2='%.1f' y2='%g' stroke='#eee'/>"
                            "<text x='%.1f' y='%g' text-anchor='middle'>%s</text>",
                            px(x), T, px(x), H - B, px(x), H - B + 15,
                            TickLabel(log_x ? std::pow(10, x) : x));
    }
    absl::StrAppendFormat(&svg,
                          "<rect x='%g' y='%g' width='%g' height='%g' fill='none' stroke='#888'/>"
                          "<text x='%g' y='%g' text-anchor='middle'>%s</text>"
                          "<text transform='translate(14,%g) rotate(-90)' "
                          "text-anchor='middle'>%s</text>",
                          L, T, W - L - R, H - T - B, (L + W - R) / 2, H - 8,
                          Html(x_label + (log_x ? " (log)" : "")), (T + H - B) / 2,
                          Html(y_label + (log_y ? " (log)" : "")));
    return svg;
  }

 private:
  void HLine(std::string* svg, double y, const char* color, const std::string& label) const {
    absl::StrAppendFormat(svg,
                          "<line x1='%g' y1='%.1f' x2='%g' y2='%.1f' stroke='%s'/>"
                          "<text x='%g' y='%.1f' text-anchor='end'>%s</text>",
                          L, py(y), W - R, py(y), color, L - 6, py(y) + 4, label);
  }
};

// The chart of `c` over the runs that recorded it; "" when none did.
std::string Chart(const std::vector<RunSeries>& runs, const ChartSpec& c) {
  const std::vector<std::vector<Point>> series = Series(runs, c);
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : series) {
    for (const Point& p : s) {
      x0 = std::min(x0, p.x);
      x1 = std::max(x1, p.x);
      y0 = std::min(y0, p.y);
      y1 = std::max(y1, p.y);
    }
  }
  if (x0 > x1) return "";
  const Axes a(x0, x1, y0, y1, c.log_y, c.log_x);
  std::string svg = a.Open(
      absl::StrCat(c.y_label, " vs ", c.x_label, c.caption_note.empty() ? "" : " ", c.caption_note),
      c.x_label, c.y_label);
  for (size_t i = 0; i < series.size(); ++i) {
    if (series[i].empty()) continue;  // a run this chart does not draw, or with no such value
    std::string pts;
    for (const Point& p : series[i]) {
      absl::StrAppendFormat(&pts, "%.1f,%.1f ", a.px(p.x), a.py(p.y));
    }
    absl::StrAppendFormat(&svg, "<polyline points='%s' fill='none' stroke='%s' stroke-width='2'/>",
                          pts, kColors[i % 10]);
  }
  return svg + "</svg></figure>";
}

// Where a gossip run's steps went: for each interval between evaluations, the mean milliseconds
// per step of each part, stacked; trainer I/O is the trainer's own timing of its calls beyond
// the worker's work on them; "other" is what the parts leave of the whole step
// (WorkerStats.step_seconds). "" when the run did not record step times.
std::string StepTimeChart(const RunSeries& run) {
  struct Layer {
    const char* key;
    const char* label;
    const char* color;
  };
  static constexpr Layer kLayers[] = {{"compute_s", "trainer compute", "#4e79a7"},
                                      {"encode_s", "local update + encode", "#f28e2b"},
                                      {"decode_s", "decode", "#edc948"},
                                      {"combine_s", "mix", "#59a14f"},
                                      {"transfer_s", "push (beyond wait)", "#76b7b2"},
                                      {"wait_s", "wait for neighbours", "#e15759"},
                                      {"trainer_io_s", "trainer I/O", "#b07aa1"},
                                      {nullptr, "other", "#bab0ac"}};
  constexpr size_t kParts = sizeof(kLayers) / sizeof(kLayers[0]);
  std::vector<double> xs;
  std::vector<std::array<double, kParts>> ms;  // per interval, per layer
  for (size_t i = 1; i < run.rows.size(); ++i) {
    const v1::MetricsRow &prev = run.rows[i - 1], &cur = run.rows[i];
    const double steps = cur.step() - prev.step();
    if (!(steps > 0) || !cur.has_step_s() || !prev.has_step_s()) continue;
    std::array<double, kParts> row{};
    double parts = 0;
    for (size_t l = 0; l + 1 < kParts; ++l) {
      row[l] = std::max(
          0.0, (Field(cur, kLayers[l].key).value_or(0) - Field(prev, kLayers[l].key).value_or(0)) /
                   steps * 1e3);
      parts += row[l];
    }
    row[kParts - 1] = std::max(0.0, (cur.step_s() - prev.step_s()) / steps * 1e3 - parts);
    xs.push_back(cur.step());
    ms.push_back(row);
  }
  if (xs.empty()) return "";
  double top = 0;
  for (const auto& row : ms) {
    double sum = 0;
    for (double v : row) sum += v;
    top = std::max(top, sum);
  }
  const Axes a(0, xs.back(), 0, top, false);
  std::string svg = a.Open("time per step (ms), " + run.name, "step", "ms per step");
  std::vector<double> below(xs.size(), 0.0);
  for (size_t l = 0; l < kParts; ++l) {
    std::string pts;
    for (size_t i = 0; i < xs.size(); ++i) {
      absl::StrAppendFormat(&pts, "%.1f,%.1f ", a.px(xs[i]), a.py(below[i] + ms[i][l]));
    }
    for (size_t i = xs.size(); i-- > 0;) {
      absl::StrAppendFormat(&pts, "%.1f,%.1f ", a.px(xs[i]), a.py(below[i]));
      below[i] += ms[i][l];
    }
    absl::StrAppendFormat(&svg, "<polygon points='%s' fill='%s' stroke='none'/>", pts,
                          kLayers[l].color);
  }
  svg += "</svg><p class='legend'>";
  for (const Layer& l : kLayers) {
    absl::StrAppendFormat(&svg, "<span><i style='background:%s'></i>%s</span>", l.color,
                          Html(l.label));
  }
  return svg + "</p></figure>";
}

// An aggregator run's accepted updates by staleness (how many rounds or FedBuff versions older
// their model was than the one they joined), as of its last row; "" when it recorded none stale.
std::string StalenessChart(const RunSeries& run) {
  if (run.rows.empty()) return "";
  const auto& counts = run.rows.back().staleness();
  if (counts.size() < 2) return "";
  double total = 0, top = 0, mean = 0;
  for (int t = 0; t < counts.size(); ++t) {
    total += static_cast<double>(counts[t]);
    mean += static_cast<double>(t) * static_cast<double>(counts[t]);
    top = std::max(top, static_cast<double>(counts[t]));
  }
  if (!(total > 0)) return "";
  const Axes a(-0.5, static_cast<double>(counts.size()) - 0.5, 0, 100 * top / total, false);
  std::string svg = a.Open(
      absl::StrFormat("staleness of the accepted updates, %s (mean %.2f, %d updates)", run.name,
                      mean / total, static_cast<int64_t>(total)),
      counts.size() >= 64 ? "staleness (the last bar: that or more)" : "staleness", "% of updates");
  const double w = std::max(1.0, (a.px(1) - a.px(0)) * 0.8);
  for (int t = 0; t < counts.size(); ++t) {
    const double y = a.py(100 * static_cast<double>(counts[t]) / total);
    absl::StrAppendFormat(&svg, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s'/>",
                          a.px(t) - w / 2, y, w, a.py(0) - y, kColors[0]);
  }
  return svg + "</svg></figure>";
}

// The legend, once for every chart (outside them, so it never covers a curve).
std::string Legend(const std::vector<RunSeries>& runs) {
  std::string h = "<p class='legend'>";
  for (size_t i = 0; i < runs.size(); ++i) {
    absl::StrAppendFormat(&h, "<span><i style='background:%s'></i>%s</span>", kColors[i % 10],
                          Html(runs[i].name));
  }
  return h + "</p>";
}

// The fields a run.json holds, one "name = value" line each.
std::string ConfigList(const v1::RunConfig& c) {
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  c.GetReflection()->ListFields(c, &fields);
  std::string h = "<pre>";
  for (const google::protobuf::FieldDescriptor* f : fields) {
    std::string value;
    google::protobuf::TextFormat::PrintFieldValueToString(c, f, -1, &value);
    absl::StrAppend(&h, Html(f->name()), " = ", Html(value), "\n");
  }
  return h + "</pre>";
}

std::string SummaryTable(const std::vector<RunSeries>& runs) {
  std::string h =
      "<table><tr><th>run</th><th>mode</th><th>algorithm / rule</th><th>codec</th>"
      "<th>workers</th><th>steps / rounds</th><th>final test acc</th><th>best test acc</th>"
      "<th>MB sent / worker</th><th>compression vs dense</th><th>wall s</th></tr>";
  for (const RunSeries& r : runs) {
    double best = 0;
    for (const v1::MetricsRow& row : r.rows) best = std::max<double>(best, row.test_acc());
    const v1::MetricsRow last = r.rows.empty() ? v1::MetricsRow() : r.rows.back();
    const v1::RunConfig& c = r.config;
    absl::StrAppendFormat(
        &h,
        "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%d</td><td>%d</td>"
        "<td>%.2f %%</td><td>%.2f %%</td><td>%.2f</td><td>%.1f×</td><td>%.1f</td></tr>",
        Html(r.name), Html(c.has_mode() ? c.mode() : "gossip"),
        Html(IsAggregatorRun(r) ? c.rule() : c.algorithm()), Html(c.codec()), c.workers(),
        last.step(), 100 * last.test_acc(), 100 * best, last.mb_sent_per_worker(),
        last.compression(), last.wall_s());
  }
  return h + "</table>";
}

std::vector<ChartSpec> Charts(const std::vector<RunSeries>& runs) {
  bool any_gossip = false, any_aggregator = false;
  for (const RunSeries& r : runs) (IsAggregatorRun(r) ? any_aggregator : any_gossip) = true;
  const bool mixed = any_gossip && any_aggregator;
  // A gossip worker's bytes are what it sent; an aggregator client's, what went up and down.
  const std::string mb = mixed        ? "MB per worker (sent, or up + down)"
                         : any_gossip ? "MB sent per worker"
                                      : "MB per client (up + down)";
  std::vector<ChartSpec> charts;
  // Charts over steps or rounds: one for the gossip runs' steps and one for the aggregator runs'
  // rounds when the report has both, never the two on one axis.
  struct Progress {
    bool any;
    RunKind runs;
    const char* x_label;  // an aggregator run's rows count rounds in `step`
    const char* note;
  };
  const Progress kinds[] = {{any_gossip, RunKind::kGossip, "step", "(gossip runs)"},
                            {any_aggregator, RunKind::kAggregator, "round", "(aggregator runs)"}};
  auto by_progress = [&](const std::string& y_key, const std::string& y_label, double y_scale) {
    for (const Progress& k : kinds) {
      if (!k.any) continue;
      charts.push_back({.x_key = "step",
                        .x_label = k.x_label,
                        .y_key = y_key,
                        .y_label = y_label,
                        .y_scale = y_scale,
                        .runs = k.runs,
                        .caption_note = mixed ? k.note : ""});
    }
  };
  by_progress("test_acc", "test accuracy (%)", 100);
  // Runs that send 100x fewer bytes than others are a point on the y axis on a linear scale.
  charts.push_back({.x_key = "mb_sent_per_worker",
                    .x_label = mb,
                    .y_key = "test_acc",
                    .y_label = "test accuracy (%)",
                    .y_scale = 100,
                    .log_x = true});
  charts.push_back({.x_key = "wall_s",
                    .x_label = "wall time (s)",
                    .y_key = "test_acc",
                    .y_label = "test accuracy (%)",
                    .y_scale = 100});
  by_progress("train_loss", "training loss", 1);
  charts.push_back({.x_key = "step",
                    .x_label = "step",
                    .y_key = "consensus",
                    .y_label = "consensus distance",
                    .log_y = true});
  for (const auto& [key, label] : std::vector<std::pair<std::string, std::string>>{
           {"payload_mb_up", "payload MB up (all clients)"},
           {"payload_mb_down", "payload MB down (all clients)"},
           {"updates_refused", "updates refused (total)"},
           {"updates_dropped", "late updates dropped (total)"},
           {"closed_s", "round closed at (s)"}}) {
    charts.push_back({.x_key = "round", .x_label = "round", .y_key = key, .y_label = label});
  }
  return charts;
}

}  // namespace

std::string RenderReport(const std::vector<RunSeries>& runs) {
  std::string h =
      "<!doctype html><html><head><meta charset='utf-8'><title>tern report</title><style>"
      "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse}"
      "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}"
      "td:first-child{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:12px}"
      "pre{white-space:pre-wrap}figure{margin:0}figcaption{font-size:13px;color:#555;margin:4px 0}"
      ".legend span{margin-right:16px}.legend i{display:inline-block;width:12px;height:12px;"
      "margin-right:6px;vertical-align:-1px}</style></head><body><h1>tern training report</h1>";
  h += SummaryTable(runs);
  h += Legend(runs);
  h += "<div class='charts'>";
  for (const ChartSpec& c : Charts(runs)) h += Chart(runs, c);
  for (const RunSeries& r : runs) h += StepTimeChart(r);
  for (const RunSeries& r : runs) h += StalenessChart(r);
  h += "</div><h2>Configurations</h2>";
  for (const RunSeries& r : runs) h += "<h3>" + Html(r.name) + "</h3>" + ConfigList(r.config);
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
