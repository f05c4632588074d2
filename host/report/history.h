// A run's summary kept across runs (--history FILE, one JSON line per run), and the trend of each
// case over them (attnhost history FILE): a slow drift shows as a slope long before one run's
// change crosses the regression gate's threshold.
#pragma once

#include "report/charts.h"
#include "report/result_set.h"

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

namespace attnhost::report {

struct HistoryPoint {
  std::string id;
  int world_size = 1;
  std::string pass;
  double median_ms = 0;
  int samples = 0;
};

struct HistoryEntry {
  std::string date, revision, device, host, suite;
  std::vector<HistoryPoint> points;
};

HistoryEntry history_entry(const ResultSet& r);                       // every timed pass that ran
void append_history(const std::filesystem::path& file, const HistoryEntry& e);  // throws UsageError
std::vector<HistoryEntry> read_history(const std::filesystem::path& file);      // throws UsageError

// One (case, world size, pass) over the runs that have it.
struct Trend {
  std::string id;
  int world_size = 1;
  std::string pass;
  std::vector<size_t> runs;      // indices into the history
  std::vector<double> medians;   // ms, one per run
  double change = 0;             // last / first - 1
  double slope = 0;              // least-squares change per run, relative to the first median
  std::string status;            // SLOWER FASTER drifting-slower drifting-faster steady
};

// `pattern`: a glob (fnmatch) or, without wildcards, a substring of the case id; "" for all.
std::vector<Trend> trends(const std::vector<HistoryEntry>& history, const std::string& pattern, double threshold);

void print_trends(std::ostream& out, const std::vector<HistoryEntry>& history, const std::vector<Trend>& trends,
                  double threshold, bool every_run);
// Median relative to each first run, with the threshold drawn as a line.
Chart trend_chart(const std::vector<Trend>& trends, const std::string& file, double threshold);

}  // namespace attnhost::report
