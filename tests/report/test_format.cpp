// Formatting (a CPU's tiny TFLOP/s keep their digits), the console block and comparison, and the
// progress line with a clock the test controls.
#include "report/console.h"
#include "report/derived.h"
#include "report/format.h"
#include "report/progress.h"
#include "report/render.h"
#include "report_test_support.h"

#include <doctest/doctest.h>

#include <sstream>

using namespace attnhost;
using namespace attnhost::report;
using test::made_case;
using test::made_run;
using test::timed_pass;

TEST_CASE("format: significant digits never round a small figure to zero") {
  CHECK(fmt::sig(0.0017123) == "0.00171");
  CHECK(fmt::sig(0.000592) == "0.000592");
  CHECK(fmt::sig(12.345) == "12.3");
  CHECK(fmt::sig(1234.6) == "1235");
  CHECK(fmt::sig(0) == "0");
  CHECK(fmt::general(4.7e-8) == "4.7e-08");
  CHECK(fmt::duration(5) == "5s");
  CHECK(fmt::duration(185) == "3m05s");
  CHECK(fmt::duration(3725) == "1h02m");
  CHECK(fmt::signed_percent(0.123) == "+12.3%");
  CHECK(fmt::signed_percent(-0.04) == "-4.0%");
}

TEST_CASE("format: tables escape what would break Markdown and HTML") {
  fmt::Table t({"case", "value"});
  t.row({"a|b", "<1>"});
  CHECK(t.markdown().find("a\\|b") != std::string::npos);
  CHECK(t.html().find("&lt;1&gt;") != std::string::npos);
}

TEST_CASE("console: the case block shows configuration, single and parallel times, totals, memory and check") {
  CaseResult c = made_case("naive_attention/x", 256,
                           {made_run(1, {timed_pass("fwd", {10, 10, 10}, 4e7), timed_pass("bwd", {20, 20, 20}, 1e8)}),
                            made_run(2, {timed_pass("fwd", {6, 6, 6}, 4e7), timed_pass("bwd", {11, 11, 11}, 1e8)})});
  c.spec.params["cpu_accumulate"] = std::string("fp32");
  c.runs[0].check.ran = c.runs[1].check.ran = true;
  c.runs[1].passes[0].speedup = 10.0 / 6;
  c.runs[1].passes[0].efficiency = 10.0 / 12;
  std::ostringstream out;
  print_case(out, c);
  const std::string s = out.str();
  CHECK(s.find("problem  B=1 S=256 H=2 D=16 bf16 non-causal") != std::string::npos);
  CHECK(s.find("params   cpu_accumulate=fp32") != std::string::npos);
  CHECK(s.find("timing   warmup: 3 warm-up + 10 timed runs of fwd, bwd") != std::string::npos);
  c.spec.timing.warmup_seconds = 1;  // a sustained warm-up is part of how a figure was made
  std::ostringstream sustained;
  print_case(sustained, c);
  CHECK(sustained.str().find("timing   warmup: 3 warm-up (at least 1 s) + 10 timed runs") != std::string::npos);
  CHECK(s.find("fwd+bwd") != std::string::npos);
  CHECK(s.find("30.000 ms") != std::string::npos);   // the single-rank total
  CHECK(s.find("17.000 ms") != std::string::npos);   // the two-rank total
  CHECK(s.find("1.76x") != std::string::npos);       // its speedup, 30 / 17
  CHECK(s.find("88.2%") != std::string::npos);       // and efficiency
  CHECK(s.find("GFLOP/s/rank") != std::string::npos);  // a CPU's throughput in its own unit:
  CHECK(s.find("  4.00  ") != std::string::npos);       // 4e7 flop in 10 ms, 4 GFLOP/s, not "0.00400" TFLOP/s
  CHECK(s.find("TFLOP/s") == std::string::npos);
  CHECK(s.find("1.00 MiB") != std::string::npos);
  CHECK(s.find("check ok") != std::string::npos);
  c.device = "cuda";  // a GPU's in TFLOP/s
  std::ostringstream gpu;
  print_case(gpu, c);
  CHECK(gpu.str().find("TFLOP/s/GPU") != std::string::npos);
  CHECK(gpu.str().find("0.00400") != std::string::npos);
}

TEST_CASE("console: compare puts plugins side by side with ratios to the first") {
  std::vector<CaseResult> cases = {
      made_case("a/tiny", 128, {made_run(1, {timed_pass("fwd", {10}), timed_pass("bwd", {20})})}, "a"),
      made_case("b/tiny", 128, {made_run(1, {timed_pass("fwd", {5}), timed_pass("bwd", {30})})}, "b")};
  std::ostringstream out;
  print_comparison(out, cases);
  const std::string s = out.str();
  CHECK(s.find("plugin (ws=1)") != std::string::npos);
  CHECK(s.find("5.000 ms (0.50x)") != std::string::npos);
  CHECK(s.find("30.000 ms (1.50x)") != std::string::npos);
  CHECK(s.find("35.000 ms (1.17x)") != std::string::npos);
  CHECK(s.find("ratio to the first plugin, a") != std::string::npos);
}

TEST_CASE("progress: plain lines off a terminal, an estimate once a case has finished") {
  double now = 100;
  std::ostringstream out;
  Progress p({1, 1, 2}, false, false, out, [&] { return now; });
  CHECK(p.position() == "case 1 of 3, 0s elapsed");
  p.start_case(0, "a");
  now += 10;
  p.finish_case(0);
  p.start_case(1, "b");
  CHECK(p.position() == "case 2 of 3, 10s elapsed, about 30s left");  // 10 s for 1 unit of 4
  now += 5;  // the running case's own time counts against the estimate
  CHECK(p.position() == "case 2 of 3, 15s elapsed, about 25s left");
  CHECK(out.str().empty());  // plain lines go to the log (stderr), not to stdout
}

TEST_CASE("progress: no estimate from finished work under 1% of the whole") {
  double now = 0;
  std::ostringstream out;
  Progress p({1, 1000}, false, false, out, [&] { return now; });
  p.start_case(0, "tiny");
  now += 1;
  p.finish_case(0);
  p.start_case(1, "huge");
  CHECK(p.position() == "case 2 of 2, 1s elapsed");
}

TEST_CASE("progress: on a terminal one status line, redrawn and erased") {
  double now = 0;
  std::ostringstream out;
  Progress p({1, 1}, true, false, out, [&] { return now; });
  p.start_case(0, "plugin/case");
  CHECK(out.str() == "\r\033[2K[case 1 of 2, 0s elapsed] plugin/case");
  p.step("plugin/case ws=2: PASSED");
  CHECK(out.str().find("plugin/case  ws=2: PASSED") != std::string::npos);
  p.clear();
  CHECK(out.str().substr(out.str().size() - 5) == "\r\033[2K");
  std::ostringstream quiet_out;
  Progress q({1}, true, true, quiet_out, [&] { return now; });
  q.start_case(0, "x");
  q.clear();
  CHECK(quiet_out.str().empty());
}

TEST_CASE("progress: work estimates follow the attended pairs") {
  suite::Case small, large;
  small.problem.batch = large.problem.batch = 1;
  small.problem.heads_q = large.problem.heads_q = 4;
  small.problem.head_dim = large.problem.head_dim = 64;
  small.problem.seqlen_q = 1024;
  large.problem.seqlen_q = 2048;
  CHECK(work_estimate(large) == doctest::Approx(4 * work_estimate(small)));
  large.problem.causal = true;
  CHECK(work_estimate(large) == doctest::Approx(2 * work_estimate(small)));
}

TEST_CASE("progress: a problem's forward and backward in GFLOP, as the CPU warning counts it") {
  suite::Problem tiny;  // the tiny preset: B=2 S=1024 H=8 D=64 causal
  tiny.batch = 2;
  tiny.seqlen_q = 1024;
  tiny.heads_q = 8;
  tiny.head_dim = 64;
  tiny.causal = true;
  CHECK(fwd_bwd_gflop(tiny) == doctest::Approx(3.5 * 4 * 64 * (2 * 1024.0 * 1024 / 2) * 8 / 1e9));
  suite::Problem small = tiny;  // B=4 S=4096 H=12 D=128: what the CPU warning names
  small.batch = 4;
  small.seqlen_q = 4096;
  small.heads_q = 12;
  small.head_dim = 128;
  CHECK(fwd_bwd_gflop(small) == doctest::Approx(721.4).epsilon(0.001));
}

TEST_CASE("csv: numbers in six significant digits, not the seventeen of a double") {
  // results.csv once held values like 12.345678901234567 ms: noise past a microsecond.
  CaseResult c;
  c.spec.id = "p/x";
  RunResult r;
  r.world_size = 1;
  r.status = "PASSED";
  PassResult p;
  p.pass = "fwd";
  p.time_ms.median = 12.345678901234567;
  r.passes.push_back(p);
  c.runs.push_back(r);
  const std::string text = csv({c});
  CHECK(text.find(",12.3457,") != std::string::npos);
  CHECK(text.find("12.34567890") == std::string::npos);
}

TEST_CASE("console: the summary flags a time whose noise is above its case's target") {
  std::vector<CaseResult> cases = {made_case("a/x", 128, {made_run(1, {timed_pass("fwd", {10, 10, 10}), timed_pass("bwd", {10, 20, 30})})})};
  std::ostringstream out;
  print_summary(out, cases);
  const std::string s = out.str();
  CHECK(s.find("10.000 ms  ") != std::string::npos);  // fwd: no spread, no flag
  CHECK(s.find("20.000 ms *") != std::string::npos);  // bwd: far above 2%
  CHECK(s.find("* 1 time's samples spread more than the case's target_noise") != std::string::npos);
}
