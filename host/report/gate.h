// The regression gate: a run against a baseline run, case by case (matched by id, world size and
// pass). A case is SLOWER or FASTER when its median moved by more than the threshold and, where
// both sides have at least 9 samples, a Mann-Whitney U test says the move is not noise
// (p < 0.05); SAME otherwise; NEW when the baseline lacks it; MISSING when this run does; MISMATCH
// when both have the id but not the same problem (shape, dtype, mask), whose times are not
// compared. Any SLOWER case fails the command (exit 1).
#pragma once

#include "common/json.h"
#include "report/format.h"
#include "results/records.h"

#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace attnhost::report {

struct GateOptions {
  double threshold = 0.20;  // relative change of the median
  double alpha = 0.05;      // significance of the Mann-Whitney test
  int min_samples = 9;      // on both sides, for the test to be used
};

struct GateRow {
  std::string id;
  int world_size = 1;
  std::string pass;
  double baseline_ms = 0, current_ms = 0;  // medians; 0 where that side has none
  int baseline_n = 0, current_n = 0;
  double change = 0;                       // current / baseline - 1
  std::optional<double> p_value;           // when both sides have min_samples
  std::string verdict;                     // FASTER SAME SLOWER NEW MISSING MISMATCH
  std::string note;                        // MISMATCH: the two problems
};

struct GateReport {
  std::string baseline;  // the baseline file, as given
  GateOptions options;
  std::vector<GateRow> rows;
  bool slower() const;
  int count(const std::string& verdict) const;
};

GateReport regression_gate(const std::vector<CaseResult>& baseline, const std::vector<CaseResult>& current,
                           const GateOptions& options, const std::string& baseline_name);

fmt::Table gate_table(const GateReport& g);
std::string gate_summary(const GateReport& g);  // "regression gate against FILE: 1 SLOWER, 7 SAME (...)"
void print_gate(std::ostream& out, const GateReport& g);

json::Value to_json(const GateReport& g);
GateReport gate_from_json(const json::Value& v);

}  // namespace attnhost::report
