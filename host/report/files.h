// The files a run leaves in its result folder. results.jsonl is the run's journal, appended and
// flushed case by case, so an interrupted run keeps every finished case and `--resume` can go on
// from it; the other reports are written from the records at the end (write_reports), and
// `attnhost report DIR` writes them again from results.json alone.
#pragma once

#include "report/result_set.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace attnhost::report {

// The formats that are files (console is not).
const std::vector<std::string>& file_formats();  // json jsonl csv markdown trace charts

class ResultFolder {
 public:
  // A fresh run starts the journal anew; a resumed one reads the cases already in it (a line
  // cut short by a kill is dropped) and appends after them. Throws UsageError.
  ResultFolder(std::filesystem::path dir, std::vector<std::string> formats, bool resume);
  const std::filesystem::path& dir() const { return dir_; }
  const std::vector<CaseResult>& earlier_cases() const { return earlier_.cases; }
  bool dropped_cut_line() const { return cut_tail_; }

  // The journal's run header; `planned`: the ids of every case of the suite, in order.
  void begin(const Environment& env, const std::string& suite_name, const std::string& suite_text,
             const std::vector<std::string>& planned);
  void append(const CaseResult& c);  // one line, flushed

  // The folder's result set: the earlier cases and this session's, in the suite's order
  // (`order`: case ids), then earlier cases the suite no longer has.
  ResultSet results(const std::vector<std::string>& order, const std::vector<CaseResult>& cases) const;

 private:
  std::filesystem::path dir_;
  std::vector<std::string> formats_;
  ResultSet earlier_;
  bool cut_tail_ = false;
  Environment env_;
  std::string suite_name_, suite_text_;
  std::ofstream journal_;
};

struct ReportsWritten {
  std::vector<std::filesystem::path> files;
  std::string notice;  // charts that could not be drawn, and why (said once)
};
// results.json, results.csv, report.md, trace.json, charts/*.svg and index.html, as `formats` asks.
ReportsWritten write_reports(const std::filesystem::path& dir, const ResultSet& results,
                             const std::vector<std::string>& formats);

}  // namespace attnhost::report
