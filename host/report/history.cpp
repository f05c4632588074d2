#include "report/history.h"

#include "common/errors.h"
#include "report/derived.h"
#include "report/format.h"
#include "report/serialize.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>

#include <fstream>
#include <map>
#include <tuple>

namespace attnhost::report {

namespace fs = std::filesystem;

HistoryEntry history_entry(const ResultSet& r) {
  HistoryEntry e;
  e.date = r.environment.date;
  e.revision = r.environment.git_revision;
  e.device = r.environment.device;
  e.host = r.environment.host;
  e.suite = r.suite_name;
  for (const CaseResult& c : r.cases)
    for (const RunResult& run : c.runs) {
      if (!run.ok()) continue;
      for (const PassResult& p : run.passes)
        if (p.time_ms.median > 0) e.points.push_back({c.spec.id, run.world_size, p.pass, p.time_ms.median, p.time_ms.count});
    }
  return e;
}

void append_history(const fs::path& file, const HistoryEntry& e) {
  json::Array points;
  for (const HistoryPoint& p : e.points)
    points.push_back(json::Object{{"id", p.id}, {"world_size", p.world_size}, {"pass", p.pass},
                                  {"median_ms", p.median_ms}, {"samples", p.samples}});
  json::Value line = json::Object{{"schema_version", kSchemaVersion}, {"kind", "history"}, {"date", e.date},
                                  {"revision", e.revision}, {"device", e.device}, {"host", e.host},
                                  {"suite", e.suite}, {"cases", points}};
  std::ofstream out(file, std::ios::app);
  out << line.dump() << '\n' << std::flush;
  if (!out) throw UsageError("--history " + file.string() + ": cannot append");
}

std::vector<HistoryEntry> read_history(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw UsageError(file.string() + ": cannot read");
  std::vector<HistoryEntry> out;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    try {
      json::Value v = json::parse(line);
      if (v["kind"].string() != "history") throw std::runtime_error("not a history line");
      HistoryEntry e;
      e.date = v["date"].string();
      e.revision = v["revision"].string();
      e.device = v["device"].string();
      e.host = v["host"].string();
      e.suite = v["suite"].string();
      for (const json::Value& p : v["cases"].array())
        e.points.push_back({p["id"].string(), static_cast<int>(p["world_size"].integer()), p["pass"].string(),
                            p["median_ms"].number(), static_cast<int>(p["samples"].integer())});
      out.push_back(std::move(e));
    } catch (const std::exception& e) {
      throw UsageError(file.string() + ":" + std::to_string(line_no) + ": not an attnhost history line: " + e.what());
    }
  }
  if (out.empty()) throw UsageError(file.string() + ": no runs recorded");
  return out;
}

namespace {

bool matches(const std::string& id, const std::string& pattern) {
  if (pattern.empty()) return true;
  if (pattern.find_first_of("*?[") != std::string::npos) return ::fnmatch(pattern.c_str(), id.c_str(), 0) == 0;
  return id.find(pattern) != std::string::npos;
}

// Least-squares slope of y over 0..n-1.
double slope_of(const std::vector<double>& y) {
  const double n = static_cast<double>(y.size());
  if (y.size() < 2) return 0;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    sx += i;
    sy += y[i];
    sxx += static_cast<double>(i) * i;
    sxy += i * y[i];
  }
  return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

std::string sparkline(const std::vector<double>& v) {
  static const char* bars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
  std::string out;
  for (double x : v) out += bars[hi > lo ? static_cast<int>((x - lo) / (hi - lo) * 7 + 0.5) : 3];
  return out;
}

}  // namespace

std::vector<Trend> trends(const std::vector<HistoryEntry>& history, const std::string& pattern, double threshold) {
  std::vector<Trend> out;
  std::map<std::tuple<std::string, int, std::string>, size_t> index;
  for (size_t run = 0; run < history.size(); ++run)
    for (const HistoryPoint& p : history[run].points) {
      if (!matches(p.id, pattern)) continue;
      auto key = std::make_tuple(p.id, p.world_size, p.pass);
      auto it = index.find(key);
      if (it == index.end()) {
        it = index.emplace(key, out.size()).first;
        out.push_back({p.id, p.world_size, p.pass});
      }
      out[it->second].runs.push_back(run);
      out[it->second].medians.push_back(p.median_ms);
    }
  for (Trend& t : out) {
    const double first = t.medians.front();
    t.change = first > 0 ? t.medians.back() / first - 1 : 0;
    std::vector<double> relative;
    for (double m : t.medians) relative.push_back(first > 0 ? m / first : 1);
    t.slope = slope_of(relative);
    // A fitted line that has already moved a quarter of the threshold across the runs is a drift
    // worth a look, though no single run has crossed the threshold yet.
    const double fitted = t.slope * (static_cast<double>(t.medians.size()) - 1);
    t.status = t.change > threshold                                    ? "SLOWER"
               : t.change < -threshold                                 ? "FASTER"
               : t.medians.size() >= 3 && fitted > threshold / 4       ? "drifting-slower"
               : t.medians.size() >= 3 && fitted < -threshold / 4      ? "drifting-faster"
                                                                        : "steady";
  }
  return out;
}

void print_trends(std::ostream& out, const std::vector<HistoryEntry>& history, const std::vector<Trend>& trends,
                  double threshold, bool every_run) {
  out << history.size() << " runs, " << history.front().date << " (" << history.front().revision << ") to "
      << history.back().date << " (" << history.back().revision << ")\n\n";
  fmt::Table t({"case", "ws", "pass", "status", "runs", "first", "last", "change", "per run", "trend"}, 4);
  for (const Trend& tr : trends) {
    std::string status = tr.status;
    if (tr.status == "drifting-slower" && tr.slope > 0) {
      const double runs_left = (threshold - tr.change) / tr.slope;
      status += " (crosses " + fmt::sig(100 * threshold) + "% in ~" + std::to_string(static_cast<int>(std::ceil(runs_left))) + " runs)";
    }
    t.row({tr.id, std::to_string(tr.world_size), pass_label(tr.pass), status, std::to_string(tr.medians.size()),
           fmt::ms(tr.medians.front()), fmt::ms(tr.medians.back()), fmt::signed_percent(tr.change),
           fmt::signed_percent(tr.slope), sparkline(tr.medians)});
  }
  out << t.str();
  if (every_run)
    for (const Trend& tr : trends) {
      out << "\n" << tr.id << " ws=" << tr.world_size << " " << pass_label(tr.pass) << "\n";
      for (size_t i = 0; i < tr.runs.size(); ++i) {
        const HistoryEntry& e = history[tr.runs[i]];
        out << "  " << e.date << "  " << e.revision << "  " << fmt::ms(tr.medians[i]) << "  " << e.device << "\n";
      }
    }
}

Chart trend_chart(const std::vector<Trend>& trends, const std::string& file, double threshold) {
  Chart c{file, "", "median time relative to each case's first run", "run", "median / first run (%)"};
  c.integer_x = true;
  c.from_zero = false;  // a drift of a few percent must be visible
  c.y_mark = 100 * (1 + threshold);
  c.y_mark_title = "threshold (+" + fmt::sig(100 * threshold) + "%)";
  for (const Trend& t : trends) {
    ChartSeries s{t.id + " ws=" + std::to_string(t.world_size) + " " + pass_label(t.pass), {}};
    for (size_t i = 0; i < t.runs.size(); ++i)
      s.points.emplace_back(static_cast<double>(t.runs[i] + 1), 100 * t.medians[i] / t.medians.front());
    c.series.push_back(std::move(s));
  }
  return c;
}

}  // namespace attnhost::report
