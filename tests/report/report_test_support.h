// Records made by hand, for the reporters' unit tests: a case with one run per world size whose
// passes hold the given samples (the runner's statistics recomputed from them).
#pragma once

#include "results/records.h"

#include <string>
#include <vector>

namespace attnhost::test {

inline PassResult timed_pass(const std::string& name, std::vector<double> samples_ms, double flops = 4e9) {
  PassResult p;
  p.pass = name;
  p.time_ms = summarize(std::move(samples_ms));
  p.flops = flops;
  p.tflops_per_gpu = flops / (p.time_ms.median * 1e-3) / 1e12;
  p.tokens_per_s = 1024 / (p.time_ms.median * 1e-3);
  return p;
}

inline std::vector<double> around(double median, int n, double spread = 0.01) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) out.push_back(median * (1 + spread * (i - n / 2) / n));
  return out;
}

inline CaseResult made_case(const std::string& id, int64_t seqlen, std::vector<RunResult> runs,
                            const std::string& plugin = "naive_attention", const std::string& group = "g") {
  CaseResult c;
  c.spec.id = id;
  c.spec.group = group;
  c.spec.label = group;
  c.spec.plugin = plugin;
  c.spec.problem.batch = 1;
  c.spec.problem.seqlen_q = c.spec.problem.seqlen_kv = seqlen;
  c.spec.problem.heads_q = c.spec.problem.heads_kv = 2;
  c.spec.problem.head_dim = 16;
  c.plugin_version = "1.0.0";
  c.device = "cpu";
  c.runs = std::move(runs);
  for (const RunResult& r : c.runs) c.spec.world_sizes.push_back(r.world_size);
  return c;
}

inline RunResult made_run(int ws, std::vector<PassResult> passes, uint64_t peak = 1 << 20) {
  RunResult r;
  r.world_size = ws;
  r.passes = std::move(passes);
  r.peak_bytes.assign(ws, peak);
  r.sent_bytes_fwd.assign(ws, ws > 1 ? 4096 : 0);
  r.sent_bytes_bwd.assign(ws, ws > 1 ? 8192 : 0);
  r.total_pairs = 1000;
  r.max_rank_pairs = 1000 / ws;
  return r;
}

}  // namespace attnhost::test
