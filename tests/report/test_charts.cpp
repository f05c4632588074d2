// Charts: which ones a run gets, that gnuplot draws them with the data in them, and that without
// gnuplot there is one notice and no chart.
#include "report/charts.h"
#include "report/files.h"
#include "report/history.h"
#include "report_test_support.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace attnhost;
using namespace attnhost::report;
using test::made_case;
using test::made_run;
using test::timed_pass;

namespace {

std::vector<CaseResult> sweep() {
  std::vector<CaseResult> out;
  for (const char* plugin : {"naive_attention", "faulty"})
    for (int64_t s : {128, 256, 512}) {
      const double t = s * s / 1e4;
      CaseResult c = made_case(std::string(plugin) + "/sweep/seqlen=" + std::to_string(s), s,
                               {made_run(1, {timed_pass("fwd", {t}), timed_pass("bwd", {2 * t})}, s * 1024),
                                made_run(2, {timed_pass("fwd", {0.6 * t}), timed_pass("bwd", {1.2 * t})}, s * 512)},
                               plugin, "sweep");
      out.push_back(c);
    }
  out.push_back(made_case("naive_attention/single", 64, {made_run(1, {timed_pass("fwd", {1})})}, "naive_attention", "single"));
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// PATH for the length of a scope.
struct PathOverride {
  explicit PathOverride(const char* path) : old_(std::getenv("PATH") ? std::getenv("PATH") : "") { ::setenv("PATH", path, 1); }
  ~PathOverride() { ::setenv("PATH", old_.c_str(), 1); }
  std::string old_;
};

}  // namespace

TEST_CASE("charts: a sweep gets time, TFLOP/s and memory against sequence length, and efficiency against world size") {
  std::vector<Chart> charts = plan_charts(sweep());
  std::vector<std::string> files;
  for (const Chart& c : charts) files.push_back(c.file);
  CHECK(files == std::vector<std::string>{"charts/sweep-time.svg", "charts/sweep-tflops.svg", "charts/sweep-memory.svg",
                                          "charts/sweep-efficiency.svg"});
  const Chart& time = charts[0];
  REQUIRE(time.series.size() == 4);  // two plugins at two world sizes
  CHECK(time.series[0].title == "naive_attention ws=1");
  CHECK(time.series[3].title == "faulty ws=2");
  REQUIRE(time.series[0].points.size() == 3);
  CHECK(time.series[0].points[2].first == 512);
  CHECK(time.series[0].points[2].second == doctest::Approx(3 * 512 * 512 / 1e4));  // fwd + bwd
  const Chart& eff = charts[3];
  CHECK(eff.series.size() == 6);  // a line per plugin and sequence length
  REQUIRE(eff.series[0].points.size() == 2);
  CHECK(eff.series[0].title == "naive_attention S=128");
  CHECK(eff.series[0].points[0] == std::pair<double, double>{1, 100});
  CHECK(eff.series[0].points[1].first == 2);
  CHECK(eff.series[0].points[1].second == doctest::Approx(100 * (3 / 1.8) / 2));  // fwd+bwd 3t on one rank, 1.8t on two
}

TEST_CASE("charts: gnuplot draws SVG files that hold the plotted data" * doctest::skip(!find_gnuplot())) {
  fs::path dir = fs::temp_directory_path() / ("attnhost-charts-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ChartsDrawn drawn = draw_charts(dir, plan_charts(sweep()));
  CHECK(drawn.notice.empty());
  REQUIRE(drawn.files.size() == 4);
  const std::string svg = slurp(dir / "charts/sweep-time.svg");
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK(svg.find("<svg") != std::string::npos);
  CHECK(svg.find("naive_attention ws=1") != std::string::npos);  // the legend
  CHECK(svg.find("sequence length (tokens)") != std::string::npos);
  size_t paths = 0;
  for (size_t at = svg.find("<path"); at != std::string::npos; at = svg.find("<path", at + 1)) ++paths;
  CHECK(paths > 10);  // axes, grid and one line per series
  CHECK(fs::exists(dir / "charts/charts.gp"));
  fs::remove_all(dir);
}

TEST_CASE("charts: without gnuplot, one notice and everything else is written") {
  fs::path dir = fs::temp_directory_path() / ("attnhost-nocharts-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ResultSet r;
  r.suite_name = "s";
  r.cases = sweep();
  ReportsWritten w;
  {
    PathOverride no_gnuplot("/nonexistent");
    CHECK_FALSE(find_gnuplot());
    w = write_reports(dir, r, {"json", "csv", "markdown", "trace", "charts"});
  }
  CHECK(w.notice == "gnuplot not found on PATH: no charts drawn (install gnuplot-nox); every other report is written");
  for (const char* f : {"results.json", "results.csv", "report.md", "trace.json", "index.html"}) CHECK(fs::exists(dir / f));
  CHECK_FALSE(fs::exists(dir / "charts/sweep-time.svg"));
  CHECK(slurp(dir / "report.md").find("![") == std::string::npos);
  CHECK(slurp(dir / "index.html").find(w.notice) != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("history: a slow drift is flagged before it crosses the threshold") {
  std::vector<HistoryEntry> h;
  for (double m : {10.0, 10.3, 10.6, 10.9, 11.2}) {  // +3% a run, +12% in all: under 20%
    HistoryEntry e;
    e.date = "d";
    e.points = {{"p/drift", 1, "fwd", m, 10}, {"p/flat", 1, "fwd", 5.0, 10}};
    h.push_back(e);
  }
  std::vector<Trend> t = trends(h, "", 0.20);
  REQUIRE(t.size() == 2);
  CHECK(t[0].id == "p/drift");
  CHECK(t[0].change == doctest::Approx(0.12));
  CHECK(t[0].slope == doctest::Approx(0.03));
  CHECK(t[0].status == "drifting-slower");
  CHECK(t[1].status == "steady");
  CHECK(trends(h, "*flat", 0.20).size() == 1);
  CHECK(trends(h, "drift", 0.20).size() == 1);
  CHECK(trends(h, "", 0.10)[0].status == "SLOWER");
  Chart c = trend_chart(t, "h.svg", 0.20);
  CHECK(*c.y_mark == doctest::Approx(120));
  CHECK(c.series[0].points.back().second == doctest::Approx(112));
}
