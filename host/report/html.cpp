// index.html: report.md's content as a page a browser shows with its charts inline (the SVGs
// gnuplot drew, beside it in charts/). Self-contained: no script, no remote resource.
#include "report/render.h"
#include "report/sections.h"

#include <sstream>

namespace attnhost::report {

namespace {
constexpr const char* kStyle = R"(body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1400px; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; }
th, td.n { white-space: nowrap; }
th { background: #f2f2f2; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.failures li { color: #a00; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.charts img { width: 640px; border: 1px solid #ddd; }
code { background: #f4f4f4; padding: 1px 4px; }
)";
}  // namespace

std::string html(const ResultSet& r, const std::vector<Chart>& charts, const std::string& charts_notice) {
  using fmt::html_escape;
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>attnhost report: "
      << html_escape(r.suite_name) << "</title>\n<style>\n" << kStyle << "</style>\n</head>\n<body>\n";
  out << "<h1>attnhost report: " << html_escape(r.suite_name) << "</h1>\n";
  fmt::Table env({"environment", ""}, 2);
  for (const auto& [key, value] : environment_facts(r)) env.row({key, value});
  out << env.html();
  size_t failed = 0;
  for (const CaseResult& c : r.cases) failed += c.failed() ? 1 : 0;
  out << "<p>" << r.cases.size() << " cases, " << failed << " failed.</p>\n";
  if (std::vector<std::string> failures = failure_lines(r.cases); !failures.empty()) {
    out << "<h2>Failures</h2>\n<ul class=\"failures\">\n";
    for (const std::string& f : failures) out << "<li>" << html_escape(f) << "</li>\n";
    out << "</ul>\n";
  }
  if (r.gate)
    out << "<h2>Regression gate</h2>\n<p>" << html_escape(gate_summary(*r.gate)) << "</p>\n" << gate_table(*r.gate).html();
  if (!charts_notice.empty()) out << "<p><em>" << html_escape(charts_notice) << "</em></p>\n";
  for (const std::string& g : group_names(r.cases)) {
    out << "<h2>" << html_escape(g) << "</h2>\n" << group_table(r.cases, g).html();
    std::string figures;
    for (const Chart& c : charts)
      if (c.group == g) figures += "<img src=\"" + html_escape(c.file) + "\" alt=\"" + html_escape(c.title) + "\">\n";
    if (!figures.empty()) out << "<div class=\"charts\">\n" << figures << "</div>\n";
  }
  out << "<p>Times are medians over the timed runs; fwd+bwd is measured when the suite timed it, else the sum of the "
         "fwd and bwd medians. Speedup and efficiency are against world size 1 of the same case.</p>\n</body>\n</html>\n";
  return out.str();
}

}  // namespace attnhost::report
