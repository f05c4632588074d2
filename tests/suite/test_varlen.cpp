// Variable-length problems: explicit lengths and the three distributions.
#include "suite_test_support.h"

#include <algorithm>
#include <numeric>

using namespace attnhost::suite;
using namespace attnhost::suite::testing;

namespace {

std::string varlen_suite(const std::string& varlen_table) {
  return "[[case]]\nname = \"docs\"\nplugins = [\"varlen\"]\nheads = 8\nhead_dim = 64\ncausal = true\n"
         "[case.varlen]\n" + varlen_table;
}

// A copy: the suite it comes from is a temporary in most tests.
SeqlenSpec varlen_of(const Suite& suite) { return *suite.cases.at(0).problem.varlen; }

int64_t total(const std::vector<int64_t>& lengths) {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
}

} // namespace

TEST_CASE("varlen: explicit lengths make a packed problem of batch 1") {
  const Suite suite = parse(varlen_suite("lengths = [100, 3000, 1]\n"));
  const Problem& p = suite.cases.at(0).problem;
  REQUIRE(p.varlen);
  CHECK(p.varlen->lengths == std::vector<int64_t>{100, 3000, 1});
  CHECK(p.varlen->distribution.empty());
  CHECK(p.batch == 1);
  CHECK(p.seqlen_q == 3101);
  CHECK(p.seqlen_kv == 3101);
  CHECK(suite.cases.at(0).id == "varlen/docs");
}

TEST_CASE("varlen: every distribution fills the budget exactly, within its bounds") {
  for (const std::string distribution : {"uniform", "lognormal", "documents"}) {
    CAPTURE(distribution);
    const Suite suite = parse(varlen_suite("distribution = \"" + distribution +
                                           "\"\ntotal_tokens = 65536\nmin_length = 16\nmax_length = 16384\nseed = 3\n"));
    const SeqlenSpec spec = varlen_of(suite);
    CHECK(spec.distribution == distribution);
    CHECK(total(spec.lengths) == 65536);
    CHECK(suite.cases.at(0).problem.seqlen_q == 65536);
    CHECK(spec.lengths.size() > 1);
    CHECK(*std::max_element(spec.lengths.begin(), spec.lengths.end()) <= 16384);
    // Only the last sequence may fall below min_length (it takes what is left of the budget).
    CHECK(*std::min_element(spec.lengths.begin(), spec.lengths.end() - 1) >= 16);
  }
}

TEST_CASE("varlen: a draw depends on its seed and on nothing else") {
  const std::string table = "distribution = \"documents\"\ntotal_tokens = 32768\nseed = ";
  const auto lengths = [&](int seed) { return varlen_of(parse(varlen_suite(table + std::to_string(seed) + "\n"))).lengths; };
  CHECK(lengths(1) == lengths(1));
  CHECK(lengths(1) != lengths(2));
}

TEST_CASE("varlen: a pinned draw, so that a change of generator is seen") {
  // The same suite must give the same lengths on every machine: these numbers are the contract.
  const SeqlenSpec spec = varlen_of(parse(varlen_suite(
      "distribution = \"uniform\"\ntotal_tokens = 1000\nmin_length = 100\nmax_length = 300\nseed = 42\n")));
  CHECK(total(spec.lengths) == 1000);
  CHECK(spec.lengths == std::vector<int64_t>{249, 132, 155, 169, 107, 188});
}

TEST_CASE("varlen: documents are many short sequences and a few long ones") {
  const SeqlenSpec spec = varlen_of(parse(varlen_suite("distribution = \"documents\"\ntotal_tokens = 1048576\nseed = 5\n")));
  const auto long_ones = std::count_if(spec.lengths.begin(), spec.lengths.end(),
                                       [](int64_t n) { return n >= 1048576 / 8; });
  const auto short_ones = std::count_if(spec.lengths.begin(), spec.lengths.end(),
                                        [](int64_t n) { return n <= 1048576 / 16; });
  CHECK(long_ones >= 1);
  CHECK(short_ones > 4 * long_ones);
}

TEST_CASE("varlen: lognormal centres on median_length") {
  const SeqlenSpec spec = varlen_of(parse(varlen_suite(
      "distribution = \"lognormal\"\ntotal_tokens = 400000\nmedian_length = 1000\nsigma = 0.5\nseed = 9\n")));
  std::vector<int64_t> sorted(spec.lengths.begin(), spec.lengths.end() - 1);
  std::sort(sorted.begin(), sorted.end());
  const int64_t median = sorted[sorted.size() / 2];
  CHECK(median > 800);
  CHECK(median < 1250);
}
