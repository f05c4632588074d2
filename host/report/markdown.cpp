#include "report/render.h"
#include "report/sections.h"

#include <sstream>

namespace attnhost::report {

std::string markdown(const ResultSet& r, const std::vector<Chart>& charts) {
  std::ostringstream out;
  out << "# attnhost report: " << r.suite_name << "\n\n";
  fmt::Table env({"environment", ""}, 2);
  for (const auto& [key, value] : environment_facts(r)) env.row({key, key == "command" ? "`" + value + "`" : value});
  out << env.markdown() << "\n";
  size_t failed = 0;
  for (const CaseResult& c : r.cases) failed += c.failed() ? 1 : 0;
  out << r.cases.size() << " cases, " << failed << " failed.\n\n";

  if (std::vector<std::string> failures = failure_lines(r.cases); !failures.empty()) {
    out << "## Failures\n\n";
    for (const std::string& f : failures) out << "- " << f << "\n";
    out << "\n";
  }
  if (r.gate) {
    out << "## Regression gate\n\n" << gate_summary(*r.gate) << "\n\n" << gate_table(*r.gate).markdown() << "\n";
  }
  for (const std::string& g : group_names(r.cases)) {
    out << "## " << g << "\n\n" << group_table(r.cases, g).markdown() << "\n";
    for (const Chart& c : charts)
      if (c.group == g) out << "![" << c.title << "](" << c.file << ")\n\n";
  }
  out << "Times are medians over the timed runs; fwd+bwd is measured when the suite timed it, else the sum of "
         "the fwd and bwd medians. Speedup and efficiency are against world size 1 of the same case.\n";
  return out.str();
}

}  // namespace attnhost::report
