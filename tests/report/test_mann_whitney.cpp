// The Mann-Whitney U test against values from scipy 1.x:
// scipy.stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic").
#include "report/mann_whitney.h"

#include <doctest/doctest.h>

using attnhost::report::mann_whitney;

TEST_CASE("mann-whitney: no ties (scipy: U=58, p=0.13291945818531892)") {
  std::vector<double> a = {1.83, 0.50, 1.62, 2.48, 1.68, 1.88, 1.55, 3.06, 1.30};
  std::vector<double> b = {0.878, 0.647, 0.598, 2.05, 1.06, 1.29, 1.06, 3.14, 1.29};
  auto r = mann_whitney(a, b);
  CHECK(r.u == doctest::Approx(58.0));
  CHECK(r.p_value == doctest::Approx(0.13291945818531892).epsilon(1e-12));
}

TEST_CASE("mann-whitney: ties within and across samples (scipy: U=23, p=0.025810877935631662)") {
  std::vector<double> a = {10, 11, 12, 12, 13, 14, 15, 15, 15, 16};
  std::vector<double> b = {12, 13, 13, 14, 16, 17, 18, 18, 19, 20, 21};
  auto r = mann_whitney(a, b);
  CHECK(r.u == doctest::Approx(23.0));
  CHECK(r.p_value == doctest::Approx(0.025810877935631662).epsilon(1e-12));
  // Two-sided: swapping the samples changes U to n1*n2 - U and keeps p.
  auto s = mann_whitney(b, a);
  CHECK(s.u == doctest::Approx(110 - 23.0));
  CHECK(s.p_value == doctest::Approx(r.p_value).epsilon(1e-12));
}

TEST_CASE("mann-whitney: complete separation of 9 and 9 (scipy: U=0, p=0.00041229480206169127)") {
  std::vector<double> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<double> b = {10, 11, 12, 13, 14, 15, 16, 17, 18};
  auto r = mann_whitney(a, b);
  CHECK(r.u == 0);
  CHECK(r.p_value == doctest::Approx(0.00041229480206169127).epsilon(1e-12));
}

TEST_CASE("mann-whitney: every value tied, or an empty side, is no evidence (p = 1)") {
  CHECK(mann_whitney(std::vector<double>(9, 5.0), std::vector<double>(9, 5.0)).p_value == 1.0);
  CHECK(mann_whitney({}, {1, 2, 3}).p_value == 1.0);
}
