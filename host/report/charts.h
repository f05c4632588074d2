// Charts, drawn by gnuplot (Debian gnuplot-nox) into SVG files: what to plot is decided here from
// the records (plan_charts), how it looks is a gnuplot script written beside the charts so a user
// can restyle and re-run it. Without gnuplot the caller gets one notice and no charts.
#pragma once

#include "results/records.h"

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attnhost::report {

struct ChartSeries {
  std::string title;
  std::vector<std::pair<double, double>> points;  // x ascending
};

struct Chart {
  std::string file;    // relative to the result folder: "charts/time-causal.svg"
  std::string group;   // the group of cases it belongs to ("" for charts of a whole run)
  std::string title, xlabel, ylabel;
  bool log_x = false, log_y = false;
  bool integer_x = false;  // world sizes: tick at integers only
  bool from_zero = true;   // y axis starts at 0 (unless logarithmic)
  std::optional<double> y_mark;  // a dashed horizontal line (history: the threshold)
  std::string y_mark_title;
  std::vector<ChartSeries> series;
};

// Per group of cases: time, TFLOP/s and peak memory against sequence length (one line per plugin
// and world size) when the group sweeps the sequence length, and parallel efficiency against world
// size when it runs more than one.
std::vector<Chart> plan_charts(const std::vector<CaseResult>& cases);

std::optional<std::filesystem::path> find_gnuplot();  // on PATH

std::string gnuplot_script(const std::vector<Chart>& charts);  // paths relative to the result folder

struct ChartsDrawn {
  std::vector<std::filesystem::path> files;  // the SVGs written
  std::string notice;                        // why none were drawn, "" when all were
};
// Writes the script (`script`, relative to `dir`) and runs gnuplot in `dir`.
ChartsDrawn draw_charts(const std::filesystem::path& dir, const std::vector<Chart>& charts,
                        const std::string& script = "charts/charts.gp");

}  // namespace attnhost::report
