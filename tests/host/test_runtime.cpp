// The runtime end to end on the CPU: real attention passes its check at every world size, each
// planted fault is caught or contained, and a failing case never stops the next.
#include "plugins/loader.h"
#include "runtime/backend.h"
#include "runtime/kernel_profiler.h"
#include "runtime/runner.h"

#include <doctest/doctest.h>

#include <algorithm>

using namespace attnhost;

namespace {

PluginRegistry& registry() {
  static PluginRegistry r = [] {
    LoaderOptions o;
    o.builtin = false;
    o.user = false;
    o.environment = false;
    o.dirs = {BUILTIN_PLUGIN_DIR, std::string(TEST_PLUGIN_DIR) + "/faulty"};
    std::vector<std::string> warnings;
    return PluginRegistry::load(o, warnings);
  }();
  return r;
}

suite::Case make_case(const std::string& plugin, std::vector<int> world_sizes, int64_t seqlen = 96, int32_t heads = 4,
                      int32_t kv_heads = 2, int32_t head_dim = 16, bool causal = true) {
  suite::Case c;
  c.id = plugin + "/test";
  c.plugin = plugin;
  c.problem.batch = 2;
  c.problem.seqlen_q = c.problem.seqlen_kv = seqlen;
  c.problem.heads_q = heads;
  c.problem.heads_kv = kv_heads;
  c.problem.head_dim = head_dim;
  c.problem.causal = causal;
  c.world_sizes = std::move(world_sizes);
  c.timing.method = "simple";
  c.timing.passes = {"fwd", "bwd"};
  return c;
}

CaseResult run(const suite::Case& c) {
  auto backend = make_thread_backend(DeviceKind::cpu, 0, std::chrono::milliseconds(2000));
  auto plugin = registry().find(c.plugin);
  REQUIRE(plugin);
  return run_case(c, plugin, *backend, RunnerOptions{});
}

suite::Case faulty(const std::string& fault, std::vector<int> ws) {
  suite::Case c = make_case("faulty", std::move(ws));
  c.params["fault"] = fault;
  return c;
}

}  // namespace

TEST_CASE("naive attention passes its check at world sizes 1, 2 and 4") {
  CaseResult r = run(make_case("naive_attention", {1, 2, 4}));
  REQUIRE(r.runs.size() == 3);
  for (const RunResult& run : r.runs) {
    INFO("world size ", run.world_size, ": ", run.error);
    CHECK(run.status == "PASSED");
    CHECK(run.check.ran);
    CHECK(run.check.rows == 2 * 4 * 96);  // small problems are checked completely
    CHECK(run.check.columns == 2 * 2 * 96);
    REQUIRE(run.passes.size() == 2);
    CHECK(run.passes[0].time_ms.count == 1);
    CHECK(run.total_pairs == 2 * 4 * 96 * 97 / 2);
    CHECK(run.peak_bytes.size() == static_cast<size_t>(run.world_size));
  }
  CHECK(r.runs[2].sent_bytes_fwd[0] > 0);
  CHECK(r.runs[1].passes[0].speedup > 0);
}

TEST_CASE("sliding window, non-causal, MQA, a length that does not divide, fp32 and packed sequences pass") {
  suite::Case window = make_case("naive_attention", {1, 3}, 100, 4, 1, 24);
  window.problem.window_left = 17;
  window.problem.window_right = 5;
  CHECK(run(window).runs[1].status == "PASSED");
  suite::Case full = make_case("naive_attention", {2}, 64, 2, 2, 32, false);
  full.problem.dtype = "fp32";
  CaseResult f = run(full);
  CHECK(f.runs[0].status == "PASSED");
  CHECK(f.runs[0].check.tensors[0].rel_l2_err < 1e-5);
  suite::Case packed = make_case("naive_attention", {1, 2});
  packed.problem.batch = 1;
  packed.problem.varlen = suite::SeqlenSpec{{1, 37, 5, 53}};
  packed.problem.seqlen_q = packed.problem.seqlen_kv = 96;
  CaseResult p = run(packed);
  for (const RunResult& run : p.runs) CHECK_MESSAGE(run.status == "PASSED", run.error);
}

TEST_CASE("FP8 inputs: naive attention passes against the reference of the dequantized inputs, outputs in bf16") {
  for (const char* dtype : {"fp8_e4m3", "fp8_e5m2"}) {
    suite::Case c = make_case("naive_attention", {1, 2}, 80, 4, 2, 32);
    c.problem.dtype = dtype;
    CaseResult r = run(c);
    for (const RunResult& run : r.runs) {
      INFO(std::string(dtype), " at world size ", run.world_size, ": ", run.error);
      CHECK(run.status == "PASSED");
      for (const TensorCheck& t : run.check.tensors) {
        INFO(t.tensor);
        // The plugin computes from the same FP8 values in fp32: what is left is the bf16 outputs'
        // rounding, far below the FP8 bounds.
        if (t.tensor != "LSE") CHECK(t.rel_l2_err < 4e-3);
        if (t.tensor == "O") CHECK(t.tol_rel_l2 == doctest::Approx(std::string(dtype) == "fp8_e4m3" ? 0.0722 : 0.1443).epsilon(0.01));
      }
    }
  }
  // The reference must read the inputs dequantized: the same inputs read without their descale
  // (a plugin that ignores it) fail.
  suite::Case ignored = faulty("ignore_fp8_descale", {1});
  ignored.problem.dtype = "fp8_e4m3";
  CHECK(run(ignored).runs[0].status == "FAILED");
  ignored.params["fault"] = std::string("none");
  const RunResult plain = run(ignored).runs[0];
  CHECK(plain.status == "PASSED");
  // The outputs' amax (ABI 1.5): a plugin that reports none is told so and passes; a wrong one fails.
  CHECK(plain.check.amax.find("(not reported by the plugin)") != std::string::npos);
  ignored.params["fault"] = std::string("wrong_amax");
  const RunResult wrong = run(ignored).runs[0];
  CHECK(wrong.status == "FAILED");
  CHECK(wrong.error == "check failed: amax of O wrong on 1 of 1 ranks");
}

TEST_CASE("one wrong element of O is caught at every world size") {
  CaseResult r = run(faulty("o_element", {1, 2}));
  for (const RunResult& run : r.runs) {
    CHECK(run.status == "FAILED");
    CHECK(run.error.rfind("check failed: O: max error", 0) == 0);
  }
}

TEST_CASE("one wrong element of dK is caught") {
  CaseResult r = run(faulty("dk_element", {1, 2}));
  for (const RunResult& run : r.runs) {
    CHECK(run.status == "FAILED");
    CHECK(run.error.find("dK: max error") != std::string::npos);
    CHECK(run.error.find("O:") == std::string::npos);
  }
}

TEST_CASE("rounds time the world sizes in turn and pool each pass's samples, checked in the first round") {
  suite::Case c = make_case("naive_attention", {1, 2});
  c.timing.method = "warmup";
  c.timing.warmup_runs = 0;
  c.timing.timing_runs = 2;
  c.timing.rounds = 3;
  std::vector<int> order;
  RunnerOptions o;
  o.progress = [&](const std::string& line) { order.push_back(line.find("ws=1") != std::string::npos ? 1 : 2); };
  std::vector<int> finished;
  o.on_run = [&](const RunResult& r) { finished.push_back(r.world_size); };
  auto backend = make_thread_backend(DeviceKind::cpu, 0, std::chrono::milliseconds(2000));
  const CaseResult r = run_case(c, registry().find(c.plugin), *backend, o);
  CHECK(order == std::vector<int>{1, 2, 1, 2, 1, 2});
  CHECK(finished == std::vector<int>{1, 2});  // once a world size's last round is in
  REQUIRE(r.runs.size() == 2);
  for (const RunResult& run : r.runs) {
    INFO("world size ", run.world_size, ": ", run.error);
    CHECK(run.status == "PASSED");
    CHECK(run.check.ran);
    for (const PassResult& p : run.passes) {
      CHECK(p.time_ms.count == 6);
      REQUIRE(p.round_medians.size() == 3);
      CHECK(p.time_ms.median >= *std::min_element(p.round_medians.begin(), p.round_medians.end()));
      CHECK(p.time_ms.median <= *std::max_element(p.round_medians.begin(), p.round_medians.end()));
      CHECK(p.tflops_per_gpu == doctest::Approx(p.flops / (p.time_ms.median * 1e-3) / 1e12 / run.world_size));
      // Each rank's own times, pooled alike; a sample is the slowest rank's, so no rank's exceeds it.
      REQUIRE(p.ranks.size() == (run.world_size > 1 ? size_t(run.world_size) : 0));
      for (const Stats& own : p.ranks) {
        CHECK(own.count == 6);
        for (size_t i = 0; i < own.samples.size(); ++i) CHECK(own.samples[i] <= p.time_ms.samples[i]);
      }
      if (!p.ranks.empty())
        CHECK(std::max(p.ranks[0].max, p.ranks[1].max) == doctest::Approx(p.time_ms.max));
      CHECK(p.sm_clock_mhz.empty());  // a CPU has no board to read
      CHECK(p.power_w.empty());
    }
  }
  CHECK(r.runs[1].passes[0].speedup == doctest::Approx(r.runs[0].passes[0].time_ms.median / r.runs[1].passes[0].time_ms.median));
  // A round that fails replaces the pooled record with its own, which says why: in the first
  // round (the check), and in a later one after a first that passed.
  suite::Case wrong = faulty("rank1_o", {2});
  wrong.timing.rounds = 2;
  wrong.check.enabled = true;
  CHECK(run(wrong).runs[0].status == "FAILED");
  suite::Case later = faulty("later_world_error", {2});
  later.timing = c.timing;
  later.timing.rounds = 2;
  std::vector<std::string> lines;
  RunnerOptions lo;
  lo.progress = [&](const std::string& line) { lines.push_back(line); };
  const CaseResult failed = run_case(later, registry().find(later.plugin), *backend, lo);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].find("round 1/2: PASSED") != std::string::npos);
  REQUIRE(failed.runs.size() == 1);
  CHECK(failed.runs[0].status == "ERROR");
  CHECK(failed.runs[0].error == "rank 0: fwd: planted forward error in a later world");
  CHECK(failed.runs[0].passes.empty());
}

TEST_CASE("a fault only on rank 1 passes alone and is caught with two ranks") {
  CaseResult r = run(faulty("rank1_o", {1, 2}));
  CHECK(r.runs[0].status == "PASSED");
  CHECK(r.runs[1].status == "FAILED");
}

TEST_CASE("a plugin error ends its case with the plugin's message, on every rank, and the next case runs") {
  CaseResult r = run(faulty("forward_error", {1, 2}));
  CHECK(r.runs[0].status == "ERROR");
  CHECK(r.runs[0].error == "fwd: planted forward error");
  CHECK(r.runs[1].status == "ERROR");
  CHECK(r.runs[1].error == "rank 0: fwd: planted forward error");
  CHECK(run(faulty("backward_error", {2})).runs[0].error == "rank 0: bwd: planted backward error");
  CHECK(run(faulty("none", {1, 2})).runs[1].status == "PASSED");
}

TEST_CASE("out of memory: the plugin's workspace and a problem larger than memory") {
  CaseResult r = run(faulty("alloc_huge", {1}));
  CHECK(r.runs[0].status == "OOM");
  CHECK(r.runs[0].error.find("out of memory on rank 0: asked 1048576.00 GiB") != std::string::npos);
  suite::Case huge = make_case("naive_attention", {1}, 1 << 20, 64, 64, 256);
  huge.problem.batch = 4096;
  CaseResult h = run(huge);
  CHECK(h.runs[0].status == "OOM");
  CHECK(h.runs[0].error.find("out of memory on rank 0: asked ") != std::string::npos);
  CHECK(run(make_case("naive_attention", {1})).runs[0].status == "PASSED");  // and the next case runs
}

TEST_CASE("a plugin that refuses the problem, and a capability the plugin lacks") {
  CaseResult r = run(faulty("refuse", {1}));
  CHECK(r.runs[0].status == "UNSUPPORTED");
  CHECK(r.runs[0].error == "plugin 'faulty' refused the problem: faulty refuses every problem");
  suite::Case fp16 = faulty("none", {1});
  fp16.problem.dtype = "fp16";
  CHECK(run(fp16).runs[0].error == "plugin 'faulty' does not support fp16 (supports bf16,fp32,fp8_e4m3)");
  CHECK_FALSE(run(fp16).failed());
  suite::Case fp8 = faulty("none", {1});
  fp8.problem.dtype = "fp8_e5m2";
  CHECK(run(fp8).runs[0].error == "plugin 'faulty' does not support fp8_e5m2 (supports bf16,fp32,fp8_e4m3)");
}

TEST_CASE("kernel names in the breakdown keep what follows an anonymous namespace") {
  // The profiler cut names at their first '(' and every kernel of an anonymous namespace showed as
  // "dilated::", its copies and adds merged into one line.
  CHECK(kernel_display_name("void dilated::(anonymous namespace)::copy_rows_kernel(dilated::(anonymous namespace)::CopyArgs)") ==
        "dilated::copy_rows_kernel");
  CHECK(kernel_display_name("void attncore::cuda::sm90::flash_forward_sm90_kernel<__nv_bfloat16, 128>(CUtensorMap_st, "
                            "attncore::cuda::AttnArgs)") == "attncore::cuda::sm90::flash_forward_sm90_kernel<__nv_bfloat16, 128>");
  CHECK(kernel_display_name("void f<(anonymous namespace)::Op>(int (*)(int))") == "f<Op>");
  CHECK(kernel_display_name("_Z3fooi") == "_Z3fooi");  // not demangled: kept
  CHECK(kernel_display_name(std::string(200, 'k')).size() == 96);
}
