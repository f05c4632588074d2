#include "report/mann_whitney.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace attnhost::report {

MannWhitney mann_whitney(const std::vector<double>& a, const std::vector<double>& b) {
  MannWhitney out;
  const double n1 = static_cast<double>(a.size()), n2 = static_cast<double>(b.size());
  if (a.empty() || b.empty()) return out;
  // Rank the pooled sample; tied values share the mean of their ranks.
  std::vector<std::pair<double, bool>> pooled;  // value, from a
  for (double x : a) pooled.emplace_back(x, true);
  for (double x : b) pooled.emplace_back(x, false);
  std::sort(pooled.begin(), pooled.end(), [](const auto& l, const auto& r) { return l.first < r.first; });
  double rank_sum_a = 0, tie_term = 0;  // tie_term: sum of t^3 - t over groups of t tied values
  for (size_t i = 0; i < pooled.size();) {
    size_t j = i;
    while (j < pooled.size() && pooled[j].first == pooled[i].first) ++j;
    const double t = static_cast<double>(j - i);
    const double mean_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    for (size_t k = i; k < j; ++k)
      if (pooled[k].second) rank_sum_a += mean_rank;
    tie_term += t * t * t - t;
    i = j;
  }
  const double n = n1 + n2;
  out.u = rank_sum_a - n1 * (n1 + 1) / 2;
  const double u_max = std::max(out.u, n1 * n2 - out.u);
  const double mean = n1 * n2 / 2;
  const double variance = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1)));
  if (variance <= 0) return out;  // every value tied: no evidence of a difference
  out.z = (u_max - mean - 0.5) / std::sqrt(variance);
  out.p_value = std::min(1.0, std::erfc(out.z / std::sqrt(2.0)));  // 2 * (1 - Phi(z))
  return out;
}

}  // namespace attnhost::report
