// The written reports, each a pure function of the records: the same records give the same bytes,
// which is what lets `attnhost report DIR` re-render a folder exactly.
#pragma once

#include "report/charts.h"
#include "report/result_set.h"

#include <string>
#include <vector>

namespace attnhost::report {

std::string csv(const std::vector<CaseResult>& cases);  // a row per (case, world size, pass)
// report.md and index.html: environment, failures first, the regression gate, then a table per
// group of cases with its charts (those drawn; paths relative to the folder).
std::string markdown(const ResultSet& r, const std::vector<Chart>& charts);
std::string html(const ResultSet& r, const std::vector<Chart>& charts, const std::string& charts_notice);
// trace.json (Chrome trace format; Perfetto and chrome://tracing open it): a process per
// (case, world size), a thread per rank, one traced iteration's host, compute and communication ranges.
std::string chrome_trace(const std::vector<CaseResult>& cases);

}  // namespace attnhost::report
