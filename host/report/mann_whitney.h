// The Mann-Whitney U test (two-sided, normal approximation with tie and continuity correction),
// the regression gate's test of "these two sets of timings differ". Small on purpose: samples of
// a benchmark are few (9 to a few hundred) and no statistics library is a dependency.
#pragma once

#include <vector>

namespace attnhost::report {

struct MannWhitney {
  double u = 0;        // U of the first sample: pairs (a, b) with a > b, ties counting one half
  double z = 0;        // standardized max(U1, U2), continuity-corrected
  double p_value = 1;  // two-sided
};

// As scipy.stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic").
// Empty inputs, or every value tied, give p = 1.
MannWhitney mann_whitney(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace attnhost::report
