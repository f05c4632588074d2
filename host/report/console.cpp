#include "report/console.h"

#include "report/format.h"

#include <algorithm>
#include <sstream>

namespace attnhost::report {

std::string problem_line(const suite::Problem& p) {
  std::ostringstream s;
  if (p.varlen) s << "packed " << p.varlen->lengths.size() << " seqs, " << p.seqlen_q << " tokens";
  else s << "B=" << p.batch << " S=" << p.seqlen_q;
  if (p.seqlen_kv > 0 && p.seqlen_kv != p.seqlen_q) s << " Skv=" << p.seqlen_kv;
  s << " H=" << p.heads_q;
  if (p.heads_kv > 0 && p.heads_kv != p.heads_q) s << " Hkv=" << p.heads_kv;
  s << " D=" << p.head_dim << " " << p.dtype << (p.causal ? " causal" : " non-causal");
  if (p.window_left >= 0 || p.window_right >= 0) s << " window=(" << p.window_left << "," << p.window_right << ")";
  return s.str();
}

namespace {

std::string pass_cell(const RunResult& r, const char* pass) {
  const PassResult* p = r.pass(pass);
  return p ? fmt::ms(p->time_ms.median) : "-";
}

const PassResult* headline(const RunResult& r) {
  for (const char* name : {"fwd_bwd", "bwd", "fwd"})
    if (const PassResult* p = r.pass(name)) return p;
  return nullptr;
}

}  // namespace

void print_case(std::ostream& out, const CaseResult& c) {
  out << "\n== " << c.spec.id << "  [" << c.spec.plugin << " " << c.plugin_version << ", " << c.device << "]\n";
  out << "   " << problem_line(c.spec.problem) << "\n";
  for (const RunResult& r : c.runs) {
    out << "   world size " << r.world_size << ": " << r.status;
    if (!r.error.empty()) out << " - " << r.error;
    out << "\n";
    for (const PassResult& p : r.passes) {
      out << "     " << p.pass << std::string(8 - std::min<size_t>(7, p.pass.size()), ' ') << fmt::ms(p.time_ms.median)
          << " median (min " << fmt::ms(p.time_ms.min) << ", p90 " << fmt::ms(p.time_ms.p90) << ", noise "
          << fmt::percent(p.time_ms.rel_noise) << ", n=" << p.time_ms.count << ")  " << fmt::fixed(p.tflops_per_gpu, 2)
          << " TFLOP/s/GPU  " << fmt::si(p.tokens_per_s) << " tok/s";
      if (p.speedup > 0 && r.world_size > 1)
        out << "  speedup " << fmt::fixed(p.speedup, 2) << "x, efficiency " << fmt::percent(p.efficiency);
      out << "\n";
      for (const KernelTime& k : p.kernels)
        out << "        " << k.name << ": " << k.launches << " x " << fmt::ms(k.mean_ms) << " = "
            << fmt::percent(k.share) << "\n";
    }
    if (!r.peak_bytes.empty()) {
      out << "     memory peak/rank " << fmt::bytes(*std::max_element(r.peak_bytes.begin(), r.peak_bytes.end()));
      if (!r.sent_bytes_fwd.empty() && r.world_size > 1)
        out << ", sent/rank fwd " << fmt::bytes(*std::max_element(r.sent_bytes_fwd.begin(), r.sent_bytes_fwd.end()))
            << " bwd " << fmt::bytes(*std::max_element(r.sent_bytes_bwd.begin(), r.sent_bytes_bwd.end()));
      if (r.max_rank_pairs > 0 && r.total_pairs > 0 && r.world_size > 1)
        out << ", load imbalance " << fmt::fixed(static_cast<double>(r.max_rank_pairs) * r.world_size / r.total_pairs, 2) << "x";
      out << "\n";
    }
    if (r.check.ran) {
      out << "     check " << (r.check.ok ? "ok" : "FAILED") << " (" << r.check.rows << " rows, " << r.check.columns
          << " columns):";
      for (const TensorCheck& t : r.check.tensors)
        out << " " << t.tensor << " " << fmt::fixed(t.rel_l2_err * 1e3, 3) << "e-3" << (t.ok ? "" : "!");
      out << " (rel L2)\n";
      if (!r.check.note.empty()) out << "     note: " << r.check.note << "\n";
    }
  }
}

void print_summary(std::ostream& out, const std::vector<CaseResult>& cases) {
  fmt::Table t({"case", "ws", "status", "fwd", "bwd", "fwd+bwd", "TFLOP/s/GPU", "speedup", "eff.", "peak mem", "check"});
  for (const CaseResult& c : cases)
    for (const RunResult& r : c.runs) {
      const PassResult* h = headline(r);
      t.row({c.spec.id, std::to_string(r.world_size), r.status, pass_cell(r, "fwd"), pass_cell(r, "bwd"),
             pass_cell(r, "fwd_bwd"), h ? fmt::fixed(h->tflops_per_gpu, 1) : "-",
             h && h->speedup > 0 && r.world_size > 1 ? fmt::fixed(h->speedup, 2) + "x" : "-",
             h && h->efficiency > 0 && r.world_size > 1 ? fmt::percent(h->efficiency) : "-",
             r.peak_bytes.empty() ? "-" : fmt::bytes(*std::max_element(r.peak_bytes.begin(), r.peak_bytes.end())),
             !r.check.ran ? "-" : r.check.ok ? "ok" : "FAILED"});
    }
  out << "\n" << t.str();
}

void print_comparison(std::ostream& out, const std::vector<CaseResult>& cases) {
  if (cases.empty()) return;
  std::vector<int> sizes;
  for (const CaseResult& c : cases)
    for (const RunResult& r : c.runs)
      if (std::find(sizes.begin(), sizes.end(), r.world_size) == sizes.end()) sizes.push_back(r.world_size);
  std::sort(sizes.begin(), sizes.end());
  out << "\n" << problem_line(cases.front().spec.problem) << "\n";
  for (int ws : sizes) {
    fmt::Table t({"plugin (ws=" + std::to_string(ws) + ")", "fwd", "x", "bwd", "x", "fwd+bwd", "x", "TFLOP/s/GPU",
                  "efficiency", "imbalance", "peak mem", "x", "check"});
    const RunResult* first = nullptr;
    for (const CaseResult& c : cases) {
      const RunResult* r = nullptr;
      for (const RunResult& x : c.runs)
        if (x.world_size == ws) r = &x;
      if (!r) continue;
      if (!first) first = r;
      auto time = [&](const char* pass) { return pass_cell(*r, pass); };
      auto ratio = [&](const char* pass) -> std::string {
        const PassResult* a = r->pass(pass);
        const PassResult* b = first->pass(pass);
        if (!a || !b || b->time_ms.median <= 0) return "-";
        return fmt::fixed(a->time_ms.median / b->time_ms.median, 2);
      };
      const PassResult* h = headline(*r);
      double peak = r->peak_bytes.empty() ? 0 : *std::max_element(r->peak_bytes.begin(), r->peak_bytes.end());
      double peak0 = first->peak_bytes.empty() ? 0 : *std::max_element(first->peak_bytes.begin(), first->peak_bytes.end());
      std::string imbalance = r->total_pairs > 0 ? fmt::fixed(static_cast<double>(r->max_rank_pairs) * ws / r->total_pairs, 2) + "x" : "-";
      t.row({c.spec.plugin + (r->status == "PASSED" || r->status == "OK" ? "" : " (" + r->status + ")"), time("fwd"),
             ratio("fwd"), time("bwd"), ratio("bwd"), time("fwd_bwd"), ratio("fwd_bwd"),
             h ? fmt::fixed(h->tflops_per_gpu, 1) : "-", h && ws > 1 && h->efficiency > 0 ? fmt::percent(h->efficiency) : "-",
             imbalance, peak > 0 ? fmt::bytes(peak) : "-", peak0 > 0 ? fmt::fixed(peak / peak0, 2) : "-",
             !r->check.ran ? "-" : r->check.ok ? "ok" : "FAILED"});
    }
    out << "\n" << t.str();
  }
  out << "(x: ratio to the first plugin; imbalance: the busiest rank's attended pairs over the mean)\n";
}

}  // namespace attnhost::report
