#include "report/files.h"

#include "common/errors.h"
#include "report/render.h"

#include <algorithm>

namespace attnhost::report {

namespace fs = std::filesystem;

const std::vector<std::string>& file_formats() {
  static const std::vector<std::string> formats = {"json", "jsonl", "csv", "markdown", "trace", "charts"};
  return formats;
}

ResultFolder::ResultFolder(fs::path dir, std::vector<std::string> formats, bool resume)
    : dir_(std::move(dir)), formats_(std::move(formats)) {
  const fs::path journal = dir_ / "results.jsonl";
  std::error_code ec;
  if (resume) {
    if (!fs::exists(journal)) throw UsageError("--resume " + dir_.string() + ": no results.jsonl in this folder");
    Journal j = read_journal(journal);
    earlier_ = std::move(j.results);
    cut_tail_ = j.cut_tail;
    // Rewrite the journal without a cut line, so the next line starts on a line of its own.
    const fs::path fresh = dir_ / "results.jsonl.tmp";
    {
      std::ofstream out(fresh, std::ios::trunc);
      for (const std::string& line : j.lines) out << line << '\n';
      if (!out) throw UsageError("cannot write " + fresh.string());
    }
    fs::rename(fresh, journal, ec);
    if (ec) throw UsageError("cannot replace " + journal.string() + ": " + ec.message());
  } else {
    fs::create_directories(dir_, ec);
    if (ec) throw UsageError("cannot create result folder " + dir_.string() + ": " + ec.message());
  }
  journal_.open(journal, resume ? std::ios::app : std::ios::trunc);
  if (!journal_) throw UsageError("cannot write " + journal.string());
}

void ResultFolder::begin(const Environment& env, const std::string& suite_name, const std::string& suite_text,
                         const std::vector<std::string>& planned) {
  env_ = env;
  suite_name_ = suite_name;
  suite_text_ = suite_text;
  journal_ << journal_header(env, suite_name, suite_text, planned).dump() << '\n' << std::flush;
}

void ResultFolder::append(const CaseResult& c) { journal_ << journal_case(c).dump() << '\n' << std::flush; }

ResultSet ResultFolder::results(const std::vector<std::string>& order, const std::vector<CaseResult>& cases) const {
  ResultSet r;
  r.suite_name = suite_name_;
  r.suite_text = suite_text_;
  r.environment = env_;
  r.sessions = earlier_.sessions;
  r.sessions.push_back(env_);
  auto find = [](const std::vector<CaseResult>& in, const std::string& id) -> const CaseResult* {
    for (const CaseResult& c : in)
      if (c.spec.id == id) return &c;
    return nullptr;
  };
  for (const std::string& id : order) {
    if (const CaseResult* c = find(cases, id)) r.cases.push_back(*c);
    else if (const CaseResult* e = find(earlier_.cases, id)) r.cases.push_back(*e);
  }
  for (const CaseResult& e : earlier_.cases)
    if (std::find(order.begin(), order.end(), e.spec.id) == order.end()) r.cases.push_back(e);
  return r;
}

ReportsWritten write_reports(const fs::path& dir, const ResultSet& results, const std::vector<std::string>& formats) {
  auto wants = [&](const char* f) { return std::find(formats.begin(), formats.end(), f) != formats.end(); };
  ReportsWritten out;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream f(dir / name, std::ios::trunc);
    f << text;
    if (!f) throw UsageError("cannot write " + (dir / name).string());
    out.files.push_back(dir / name);
  };
  std::vector<Chart> drawn;
  if (wants("charts")) {
    std::vector<Chart> planned = plan_charts(results.cases);
    ChartsDrawn d = draw_charts(dir, planned);
    out.notice = d.notice;
    for (const Chart& c : planned)
      if (std::find(d.files.begin(), d.files.end(), dir / c.file) != d.files.end()) drawn.push_back(c);
    out.files.insert(out.files.end(), d.files.begin(), d.files.end());
  }
  if (wants("json")) write("results.json", to_json(results).dump(1) + "\n");
  if (wants("json") || wants("trace")) write("trace.json", chrome_trace(results.cases));
  if (wants("csv")) write("results.csv", csv(results.cases));
  if (wants("markdown")) write("report.md", markdown(results, drawn));
  if (wants("charts")) write("index.html", html(results, drawn, out.notice));
  return out;
}

}  // namespace attnhost::report
