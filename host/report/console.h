// The console reporter: a readable block per case, a summary table, a side-by-side comparison.
#pragma once

#include "report/records.h"

#include <ostream>
#include <vector>

namespace attnhost::report {

void print_case(std::ostream& out, const CaseResult& c);
void print_summary(std::ostream& out, const std::vector<CaseResult>& cases);
// Plugins side by side at each world size; every figure with its ratio to the first plugin.
void print_comparison(std::ostream& out, const std::vector<CaseResult>& cases);

std::string problem_line(const suite::Problem& p);

}  // namespace attnhost::report
