// The parts of a written report (report.md and index.html tell the same things in two syntaxes):
// the environment, the failures, a table per group of cases, the regression gate.
#pragma once

#include "report/format.h"
#include "report/result_set.h"

#include <string>
#include <utility>
#include <vector>

namespace attnhost::report {

std::vector<std::pair<std::string, std::string>> environment_facts(const ResultSet& r);
std::vector<std::string> failure_lines(const std::vector<CaseResult>& cases);  // one per failed run
std::vector<std::string> group_names(const std::vector<CaseResult>& cases);    // in order of appearance
fmt::Table group_table(const std::vector<CaseResult>& cases, const std::string& group);

}  // namespace attnhost::report
