#include "results/records.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace attnhost {

namespace {
// Linear interpolation between closest ranks (numpy's default).
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  double pos = q * (sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}
}  // namespace

Stats summarize(std::vector<double> samples) {
  Stats s;
  s.samples = samples;
  s.count = static_cast<int>(samples.size());
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.min = samples.front();
  s.max = samples.back();
  s.median = percentile(samples, 0.5);
  s.p10 = percentile(samples, 0.1);
  s.p90 = percentile(samples, 0.9);
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / samples.size();
  double var = 0;
  for (double x : samples) var += (x - s.mean) * (x - s.mean);
  s.stddev = samples.size() > 1 ? std::sqrt(var / (samples.size() - 1)) : 0;
  s.rel_noise = s.mean > 0 ? s.stddev / s.mean : 0;
  return s;
}

bool CaseResult::failed() const {
  for (const RunResult& r : runs)
    if (r.status != "PASSED" && r.status != "OK" && r.status != "SKIPPED" && r.status != "UNSUPPORTED") return true;
  return false;
}

}  // namespace attnhost
