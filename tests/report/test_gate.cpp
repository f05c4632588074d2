// The regression gate's classification on hand-made records: the threshold on medians, the
// Mann-Whitney test where both sides have 9 samples, NEW and MISSING, and its round trip to JSON.
#include "report/gate.h"
#include "report_test_support.h"

#include <doctest/doctest.h>

#include <sstream>

using namespace attnhost;
using namespace attnhost::report;
using test::around;
using test::made_case;
using test::made_run;
using test::timed_pass;

namespace {

std::vector<CaseResult> one(double median_ms, int samples, const std::string& id = "p/a") {
  return {made_case(id, 128, {made_run(1, {timed_pass("fwd", around(median_ms, samples))})})};
}

const GateRow& only_row(const GateReport& g) {
  REQUIRE(g.rows.size() == 1);
  return g.rows.front();
}

}  // namespace

TEST_CASE("gate: medians beyond the threshold are SLOWER or FASTER, within it SAME") {
  GateOptions o;  // 20%
  CHECK(only_row(regression_gate(one(10, 3), one(12.5, 3), o, "b")).verdict == "SLOWER");
  CHECK(only_row(regression_gate(one(10, 3), one(11.5, 3), o, "b")).verdict == "SAME");
  CHECK(only_row(regression_gate(one(10, 3), one(7.5, 3), o, "b")).verdict == "FASTER");
  CHECK(only_row(regression_gate(one(10, 3), one(8.5, 3), o, "b")).verdict == "SAME");
  o.threshold = 0.05;
  const GateRow& r = only_row(regression_gate(one(10, 3), one(11, 3), o, "b"));
  CHECK(r.verdict == "SLOWER");
  CHECK(r.change == doctest::Approx(0.1));
  CHECK_FALSE(r.p_value.has_value());  // fewer than 9 samples: the threshold alone decides
}

TEST_CASE("gate: with 9 samples on both sides a move must also be significant") {
  GateOptions o;
  // Clearly separated samples, 30% slower: significant and beyond the threshold.
  GateReport slower = regression_gate(one(10, 9), one(13, 9), o, "b");
  CHECK(only_row(slower).verdict == "SLOWER");
  REQUIRE(only_row(slower).p_value.has_value());
  CHECK(*only_row(slower).p_value < 0.05);
  CHECK(slower.slower());
  // Medians 30% apart but samples that overlap completely (a bimodal noisy case): not significant.
  std::vector<double> base = {5, 5, 5, 5, 10, 15, 15, 15, 15};
  std::vector<double> cur = {5, 5, 5, 5, 13, 15, 15, 15, 15};
  std::vector<CaseResult> b = {made_case("p/a", 128, {made_run(1, {timed_pass("fwd", base)})})};
  std::vector<CaseResult> c = {made_case("p/a", 128, {made_run(1, {timed_pass("fwd", cur)})})};
  const GateRow& noisy = only_row(regression_gate(b, c, o, "b"));
  CHECK(noisy.change == doctest::Approx(0.3));
  REQUIRE(noisy.p_value.has_value());
  CHECK(*noisy.p_value > 0.05);
  CHECK(noisy.verdict == "SAME");
}

TEST_CASE("gate: cases match by id, world size and pass, the rest are NEW or MISSING") {
  std::vector<CaseResult> base = {
      made_case("p/a", 128, {made_run(1, {timed_pass("fwd", {10}), timed_pass("bwd", {20})}), made_run(2, {timed_pass("fwd", {6})})}),
      made_case("p/gone", 128, {made_run(1, {timed_pass("fwd", {1})})})};
  std::vector<CaseResult> cur = {
      made_case("p/a", 128, {made_run(1, {timed_pass("fwd", {10}), timed_pass("bwd", {30})}), made_run(4, {timed_pass("fwd", {3})})}),
      made_case("p/new", 128, {made_run(1, {timed_pass("fwd", {1})})})};
  GateReport g = regression_gate(base, cur, GateOptions{}, "base.json");
  std::map<std::string, std::string> verdict;
  for (const GateRow& r : g.rows) verdict[r.id + " " + std::to_string(r.world_size) + " " + r.pass] = r.verdict;
  CHECK(verdict == std::map<std::string, std::string>{{"p/a 1 fwd", "SAME"}, {"p/a 1 bwd", "SLOWER"},
                                                      {"p/a 4 fwd", "NEW"}, {"p/new 1 fwd", "NEW"},
                                                      {"p/a 2 fwd", "MISSING"}, {"p/gone 1 fwd", "MISSING"}});
  CHECK(g.count("MISSING") == 2);
  CHECK(gate_summary(g).find("1 SLOWER, 1 SAME, 2 NEW, 2 MISSING") != std::string::npos);
}

TEST_CASE("gate: a run that failed has no timing to compare: its baseline rows are MISSING") {
  std::vector<CaseResult> cur = one(10, 3);
  cur[0].runs[0].status = "ERROR";
  GateReport g = regression_gate(one(10, 3), cur, GateOptions{}, "b");
  CHECK(only_row(g).verdict == "MISSING");
  CHECK_FALSE(g.slower());
}

TEST_CASE("gate: the report survives JSON and prints a table with every verdict") {
  GateReport g = regression_gate(one(10, 9), one(13, 9), GateOptions{}, "old/results.json");
  GateReport back = gate_from_json(json::parse(to_json(g).dump()));
  REQUIRE(back.rows.size() == 1);
  CHECK(back.rows[0].verdict == "SLOWER");
  CHECK(*back.rows[0].p_value == *g.rows[0].p_value);
  CHECK(back.baseline == "old/results.json");
  std::ostringstream out;
  print_gate(out, back);
  CHECK(out.str().find("SLOWER") != std::string::npos);
  CHECK(out.str().find("+30.0%") != std::string::npos);
}

TEST_CASE("gate: one id with another problem is a MISMATCH, never a timing") {
  // A B=2 case against a B=4 case of the same id was once called +117% SLOWER.
  std::vector<CaseResult> b = one(10, 3), c = one(21.7, 3);
  c[0].spec.problem.batch = 4;
  const GateReport g = regression_gate(b, c, GateOptions{}, "b");
  const GateRow& r = only_row(g);
  CHECK(r.verdict == "MISMATCH");
  CHECK(r.note == "baseline B=1 S=128 H=2 D=16 bf16 non-causal; current B=4 S=128 H=2 D=16 bf16 non-causal");
  CHECK_FALSE(g.slower());
  std::ostringstream out;
  print_gate(out, g);
  CHECK(out.str().find("p/a (ws=1, fwd): not compared, the problems differ: baseline B=1") != std::string::npos);
  CHECK(out.str().find("1 MISMATCH") != std::string::npos);
  CHECK(gate_from_json(to_json(g)).rows[0].note == r.note);
  // The same problem still compares.
  CHECK(only_row(regression_gate(one(10, 3), one(21.7, 3), GateOptions{}, "b")).verdict == "SLOWER");
}
