#include "report/console.h"

#include "report/derived.h"
#include "report/format.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace attnhost::report {

std::string problem_line(const suite::Problem& p) {
  std::ostringstream s;
  if (p.varlen) s << "packed " << p.varlen->lengths.size() << " seqs, " << p.seqlen_q << " tokens";
  else s << "B=" << p.batch << " S=" << p.seqlen_q;
  if (p.seqlen_kv > 0 && p.seqlen_kv != p.seqlen_q) s << " Skv=" << p.seqlen_kv;
  s << " H=" << p.heads_q;
  if (p.heads_kv > 0 && p.heads_kv != p.heads_q) s << " Hkv=" << p.heads_kv;
  s << " D=" << p.head_dim << " " << p.dtype << (p.grad_dtype.empty() ? "" : " (dO " + p.grad_dtype + ")")
    << (p.causal ? " causal" : " non-causal");
  if (p.window_left >= 0 || p.window_right >= 0) s << " window=(" << p.window_left << "," << p.window_right << ")";
  return s.str();
}

std::string params_line(const suite::Case& c) {
  std::ostringstream s;
  for (const auto& [key, value] : c.params) {
    s << (s.tellp() > 0 ? " " : "") << key << "=";
    std::visit([&](const auto& v) {
      using T = std::decay_t<decltype(v)>;
      if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
        for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
      } else if constexpr (std::is_same_v<T, bool>) {
        s << (v ? "true" : "false");
      } else {
        s << v;
      }
    }, value);
  }
  return s.str();
}

std::string timing_line(const suite::Case& c) {
  const suite::Timing& t = c.timing;
  std::ostringstream s;
  s << t.method << ": ";
  std::string warmup = std::to_string(t.warmup_runs) + " warm-up";
  if (t.warmup_seconds > 0) warmup += " (at least " + fmt::general(t.warmup_seconds, 3) + " s)";
  if (t.rounds > 1) s << t.rounds << " rounds of ";
  if (t.method == "simple")
    s << "one timed run" << (t.warmup_seconds > 0 ? " after at least " + fmt::general(t.warmup_seconds, 3) + " s of warm-up" : "");
  else if (t.method == "adaptive")
    s << warmup << ", then until noise < " << fmt::percent(t.target_noise) << " (at least " << t.min_samples
      << " runs, at most " << fmt::sig(t.max_seconds) << " s)";
  else s << warmup << " + " << t.timing_runs << " timed runs";
  s << " of";
  for (size_t i = 0; i < t.passes.size(); ++i) s << (i ? ", " : " ") << pass_label(t.passes[i]);
  if (!t.flush_l2) s << "; L2 not flushed";
  return s.str();
}

namespace {

std::string speedup_cell(const PassResult& p, int ws) { return ws > 1 && p.speedup > 0 ? fmt::ratio(p.speedup) : "-"; }
std::string efficiency_cell(const PassResult& p, int ws) { return ws > 1 && p.efficiency > 0 ? fmt::percent(p.efficiency) : "-"; }
// "0.31 of 2.10 / 1.20 of 9.84 ms": exposed of all communication, forward / backward, traced iteration.
std::string exposure_cell(const RunResult& r) {
  const auto part = [&](const char* range) {
    const std::optional<CommExposure> x = exposed_communication(r, range);
    return x ? fmt::fixed(x->exposed_ms, 2) + " of " + fmt::fixed(x->comm_ms, 2) : std::string("-");
  };
  const std::string f = part("forward"), b = part("backward");
  return f == "-" && b == "-" ? "-" : f + " / " + b + " ms";
}

std::string indented(const std::string& text) {
  std::istringstream in(text);
  std::string out;
  for (std::string line; std::getline(in, line);) out += "   " + line + "\n";
  return out;
}

std::string check_detail(const RunResult& r) {
  std::ostringstream s;
  s << (r.check.ok ? "ok" : "FAILED") << ", " << r.check.rows << " rows and " << r.check.columns
    << " columns against float64; rel L2 error";
  for (const TensorCheck& t : r.check.tensors) {
    s << " " << t.tensor << " " << fmt::general(t.rel_l2_err) << (t.ok ? "" : " (over " + fmt::general(t.tol_rel_l2) + ")");
    if (t.nonfinite > 0) s << " [" << t.nonfinite << " NaN/Inf]";
  }
  for (const TensorCheck& t : r.check.tensors)
    if (!t.ok && !t.worst.empty()) s << "; worst " << t.tensor << " at " << t.worst;
  return s.str();
}

}  // namespace

void print_case(std::ostream& out, const CaseResult& c) {
  const bool failed = c.failed();
  out << "\n== " << c.spec.id << "  " << (failed ? "FAILED" : "ok") << "\n";
  out << "   plugin   " << c.spec.plugin << " " << c.plugin_version << " on " << c.device
      << (c.engine.empty() ? "" : " (" + c.engine + ")") << "\n";
  out << "   problem  " << problem_line(c.spec.problem) << "\n";
  if (std::string params = params_line(c.spec); !params.empty()) out << "   params   " << params << "\n";
  out << "   timing   " << timing_line(c.spec) << "\n";

  const bool cpu = c.device == "cpu";
  fmt::Table times({"ws", "pass", "median", "min", "p90", "noise", "n", flops_heading(cpu), "tokens/s", "speedup", "efficiency"}, 2);
  fmt::Table resources({"ws", "status", "peak mem/rank", "sent fwd/rank", "sent bwd/rank", "comm exposed fwd / bwd",
                        "imbalance", "check"},
                       2);
  std::vector<std::string> notes;
  for (const RunResult& r : c.runs) {
    const std::string ws = std::to_string(r.world_size);
    for (const PassResult& p : shown_passes(c, r)) {
      const bool sum = p.time_ms.count == 0;  // a derived total has no samples of its own
      times.row({ws, pass_label(p.pass), fmt::ms(p.time_ms.median), sum ? "" : fmt::ms(p.time_ms.min),
                 sum ? "" : fmt::ms(p.time_ms.p90), sum ? "" : fmt::percent(p.time_ms.rel_noise),
                 sum ? "sum" : std::to_string(p.time_ms.count), flops_cell(p.tflops_per_gpu, cpu), fmt::si(p.tokens_per_s),
                 speedup_cell(p, r.world_size), efficiency_cell(p, r.world_size)});
    }
    const double imbalance = load_imbalance(r);
    resources.row({ws, r.status, r.peak_bytes.empty() ? "-" : fmt::bytes(max_peak_bytes(r)),
                   r.world_size > 1 && !r.sent_bytes_fwd.empty() ? fmt::bytes(max_sent_bytes(r.sent_bytes_fwd)) : "-",
                   r.world_size > 1 && !r.sent_bytes_bwd.empty() ? fmt::bytes(max_sent_bytes(r.sent_bytes_bwd)) : "-",
                   exposure_cell(r), r.world_size > 1 && imbalance > 0 ? fmt::ratio(imbalance) : "-", check_cell(r)});
    const std::string at = "ws=" + std::to_string(r.world_size) + " ";
    if (!r.error.empty()) notes.push_back(at + r.status + ": " + r.error);
    if (r.check.ran) notes.push_back(at + "check " + check_detail(r));
    if (!r.check.note.empty()) notes.push_back(at + "check note: " + r.check.note);
    if (!r.check.amax.empty()) notes.push_back(at + r.check.amax);
    if (!r.engine.empty()) notes.push_back(at + r.engine);
    for (const PassResult& p : r.passes) {
      if (!p.time_ms.stop_reason.empty() && c.spec.timing.method == "adaptive" && p.round_medians.empty())
        notes.push_back(at + pass_label(p.pass) + " stopped: " + p.time_ms.stop_reason);
      if (!p.round_medians.empty()) {
        std::string medians;
        for (double m : p.round_medians) medians += (medians.empty() ? "" : ", ") + fmt::ms(m);
        notes.push_back(at + pass_label(p.pass) + " medians by round: " + medians);
      }
      if (const std::string spread = rank_spread(p); !spread.empty()) notes.push_back(at + pass_label(p.pass) + " " + spread);
      if (const std::string boards = board_readings(p); !boards.empty()) notes.push_back(at + pass_label(p.pass) + " " + boards);
      for (const KernelTime& k : p.kernels)
        notes.push_back(at + pass_label(p.pass) + " " + k.name + ": " + std::to_string(k.launches) + " x " +
                        fmt::ms(k.mean_ms) + " = " + fmt::percent(k.share));
    }
  }
  out << "\n";
  if (!times.empty()) out << indented(times.str()) << "\n";
  out << indented(resources.str());
  for (const std::string& n : notes) out << "   " << n << "\n";
  out << std::flush;  // a block is whole before the next case's progress line on stderr
}

void print_case_line(std::ostream& out, const CaseResult& c) {
  std::ostringstream line;
  std::vector<std::string> errors;
  line << c.spec.id;
  for (const RunResult& r : c.runs) {
    line << "  ws=" << r.world_size << " ";
    const std::optional<PassResult> h = headline_pass(c, r);
    if (!r.ok() || !h) {
      line << r.status;
      if (!r.error.empty()) errors.push_back("ws=" + std::to_string(r.world_size) + " " + r.status + ": " + r.error);
      continue;
    }
    line << pass_label(h->pass) << " " << fmt::ms(h->time_ms.median);
    if (r.world_size > 1 && h->speedup > 0) line << " " << fmt::ratio(h->speedup) << " " << fmt::percent(h->efficiency);
    if (r.check.ran) line << " check " << check_cell(r);
  }
  out << line.str() << "\n";
  for (const std::string& e : errors) out << "   " << e << "\n";
  out << std::flush;
}

void print_summary(std::ostream& out, const std::vector<CaseResult>& cases) {
  const bool cpu = all_on_cpu(cases);
  fmt::Table t({"case", "ws", "status", "fwd", "bwd", "fwd+bwd", flops_heading(cpu), "speedup", "eff.", "peak mem", "check"}, 3);
  int noisy_figures = 0;
  for (const CaseResult& c : cases)
    for (const RunResult& r : c.runs) {
      std::optional<PassResult> h = headline_pass(c, r);
      std::optional<PassResult> total = total_pass(c, r);
      auto flagged = [&](const PassResult& p) {
        const bool noisy = p.time_ms.count > 1 && p.time_ms.rel_noise > c.spec.timing.target_noise;
        noisy_figures += noisy;
        return fmt::ms(p.time_ms.median) + (noisy ? " *" : "");
      };
      auto time = [&](const char* pass) {
        const PassResult* p = r.pass(pass);
        return p ? flagged(*p) : std::string("-");
      };
      t.row({c.spec.id, std::to_string(r.world_size), r.status, time("fwd"), time("bwd"),
             total ? flagged(*total) : "-", h ? flops_cell(h->tflops_per_gpu, cpu) : "-",
             h ? speedup_cell(*h, r.world_size) : "-", h ? efficiency_cell(*h, r.world_size) : "-",
             r.peak_bytes.empty() ? "-" : fmt::bytes(max_peak_bytes(r)), check_cell(r)});
    }
  out << "\n" << t.str();
  size_t failed = std::count_if(cases.begin(), cases.end(), [](const CaseResult& c) { return c.failed(); });
  out << cases.size() << " cases, " << failed << " failed"
      << "  (" << flops_heading(cpu) << ", speedup and eff. of fwd+bwd; speedup and efficiency against world size 1)\n";
  if (noisy_figures > 0)
    out << "* " << noisy_figures << (noisy_figures == 1 ? " time's" : " times'")
        << " samples spread more than the case's target_noise (the noise column of its block, -v): read them as less certain\n";
  if (cpu && std::any_of(cases.begin(), cases.end(), [](const CaseResult& c) {
        return std::any_of(c.runs.begin(), c.runs.end(), [](const RunResult& r) { return r.world_size > 1; });
      }))
    out << "(on the CPU a rank is a thread and the ranks share this machine's cores: speedup and efficiency say how the "
           "threads fared, not what more GPUs would do, and may pass 100% where caches favour smaller pieces)\n";
}

// What verify checked, without timings (first calls, which say nothing of speed): each tensor's
// relative L2 error against float64 beside its tolerance, per world size.
void print_verification(std::ostream& out, const std::vector<CaseResult>& cases) {
  const auto error = [](double v) {  // 3 significant digits; small ones as 3.65e-08 rather than 0.0000000365
    if (v == 0 || v >= 1e-3) return fmt::sig(v);
    char text[32];
    std::snprintf(text, sizeof(text), "%.2e", v);
    return std::string(text);
  };
  const std::vector<std::string> tensors = {"O", "LSE", "dQ", "dK", "dV"};
  std::vector<std::string> head = {"case", "ws", "status"};
  for (const std::string& t : tensors) head.push_back(t + " err / tol");
  fmt::Table t(head, 3);
  for (const CaseResult& c : cases)
    for (const RunResult& r : c.runs) {
      std::vector<std::string> row = {c.spec.id, std::to_string(r.world_size), r.status};
      for (const std::string& name : tensors) {
        const auto found = std::find_if(r.check.tensors.begin(), r.check.tensors.end(),
                                        [&](const TensorCheck& x) { return x.tensor == name; });
        row.push_back(found == r.check.tensors.end() ? "-"
                                                     : error(found->rel_l2_err) + " / " + error(found->tol_rel_l2) +
                                                           (found->ok ? "" : " FAIL"));
      }
      t.row(row);
    }
  out << "\n" << t.str();
  size_t failed = std::count_if(cases.begin(), cases.end(), [](const CaseResult& c) { return c.failed(); });
  out << cases.size() << " cases, " << failed << " failed  (relative L2 error against float64 / its tolerance)\n";
}

}  // namespace attnhost::report
