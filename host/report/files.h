// The files a run leaves in its result folder. results.jsonl is appended and flushed case by
// case as cases finish, so an interrupted run keeps every finished case; the rest are written
// from the same records at the end.
#pragma once

#include "report/records.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace attnhost::report {

class ResultFolder {
 public:
  // Creates the folder; throws UsageError when it cannot.
  ResultFolder(std::filesystem::path dir, std::vector<std::string> formats);
  const std::filesystem::path& dir() const { return dir_; }
  bool wants(const std::string& format) const;

  void begin(const Environment& env, const std::string& suite_name, const std::string& suite_text);
  void append(const CaseResult& c);   // results.jsonl, flushed
  // results.json, results.csv, report.md, trace.json; returns the files written.
  std::vector<std::filesystem::path> finish(const Environment& env, const std::string& suite_name,
                                            const std::string& suite_text, const std::vector<CaseResult>& cases);

 private:
  std::filesystem::path dir_;
  std::vector<std::string> formats_;
  std::ofstream jsonl_;
};

std::string csv(const std::vector<CaseResult>& cases);
std::string markdown(const Environment& env, const std::string& suite_name, const std::vector<CaseResult>& cases);
std::string chrome_trace(const std::vector<CaseResult>& cases);  // Perfetto / chrome://tracing

}  // namespace attnhost::report
