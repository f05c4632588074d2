// What a result folder holds, as one value: the environment, the suite, every case, and the
// regression gate when the run had a baseline. results.json is this value; results.jsonl is its
// journal (a header line per session, then a line per finished case) from which it can be rebuilt.
#pragma once

#include "common/json.h"
#include "report/gate.h"
#include "results/records.h"

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace attnhost::report {

struct ResultSet {
  std::string suite_name, suite_text;
  Environment environment;             // of the session that wrote the reports
  std::vector<Environment> sessions;   // every session that ran cases into the folder (--resume), oldest first
  std::vector<CaseResult> cases;
  std::optional<GateReport> gate;
  // The ids of every case of the suite, in order, as the journal's latest run header lists them
  // (empty for older journals): what a stopped run never reached is the rest.
  std::vector<std::string> planned;
};

json::Value to_json(const ResultSet& r);               // results.json
ResultSet result_set_from_json(const json::Value& v);  // throws std::runtime_error on a malformed document

// results.jsonl as written so far. A kill can cut the last line short: that line is dropped
// (cut_tail tells), while a malformed line anywhere else is an error.
struct Journal {
  std::vector<std::string> lines;  // the well-formed lines, in order
  ResultSet results;               // sessions and cases read from them (a case id twice: the last wins)
  bool cut_tail = false;
};
Journal read_journal(const std::filesystem::path& file);  // throws UsageError "FILE:LINE: why"

// A results.json, a results.jsonl, or a folder holding either (results.json first).
// Every problem is a UsageError of one line that names the file.
ResultSet load_results(const std::filesystem::path& path);

json::Value journal_header(const Environment& env, const std::string& suite_name, const std::string& suite_text,
                           const std::vector<std::string>& planned);
json::Value journal_case(const CaseResult& c);

}  // namespace attnhost::report
