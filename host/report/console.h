// The console reporter: a readable block per case, a summary table, a side-by-side comparison.
// It reads records only (results/records.h); nothing here measures.
#pragma once

#include "results/records.h"

#include <ostream>
#include <vector>

namespace attnhost::report {

void print_case(std::ostream& out, const CaseResult& c);
// A case in a line: each world size's status and headline time (speedup and efficiency above 1),
// and the check; a run's error on a line of its own. What `run` prints without -v.
void print_case_line(std::ostream& out, const CaseResult& c);
void print_summary(std::ostream& out, const std::vector<CaseResult>& cases);
void print_verification(std::ostream& out, const std::vector<CaseResult>& cases);
// Plugins side by side at each world size; every figure with its ratio to the first plugin.
void print_comparison(std::ostream& out, const std::vector<CaseResult>& cases);

std::string problem_line(const suite::Problem& p);
std::string params_line(const suite::Case& c);   // "block_size=128 overlap=true", "" when none
std::string timing_line(const suite::Case& c);   // "warmup: 1 warm-up + 3 timed runs of fwd, bwd"

}  // namespace attnhost::report
