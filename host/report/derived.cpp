#include "report/derived.h"

#include "report/format.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace attnhost::report {

bool run_failed(const RunResult& r) { return !r.ok() && r.status != "SKIPPED" && r.status != "UNSUPPORTED"; }

namespace {

// fwd + bwd of one run, without speedup.
std::optional<PassResult> sum_of_passes(const RunResult& r) {
  if (const PassResult* measured = r.pass("fwd_bwd")) return *measured;
  const PassResult* f = r.pass("fwd");
  const PassResult* b = r.pass("bwd");
  if (!f || !b || f->time_ms.median <= 0 || b->time_ms.median <= 0) return std::nullopt;
  PassResult t;
  t.pass = "fwd+bwd";
  t.time_ms.median = f->time_ms.median + b->time_ms.median;
  t.time_ms.mean = f->time_ms.mean + b->time_ms.mean;
  t.time_ms.min = f->time_ms.min + b->time_ms.min;
  t.flops = f->flops + b->flops;
  const double seconds = t.time_ms.median * 1e-3;
  t.tflops_per_gpu = t.flops / seconds / 1e12 / std::max(1, r.world_size);
  const double tokens = f->tokens_per_s * f->time_ms.median * 1e-3;  // the runner's token count
  t.tokens_per_s = tokens / seconds;
  return t;
}

}  // namespace

std::optional<PassResult> total_pass(const CaseResult& c, const RunResult& r) {
  std::optional<PassResult> t = sum_of_passes(r);
  if (!t || t->pass == "fwd_bwd" || r.shared_gpus) return t;
  for (const RunResult& single : c.runs)
    if (single.world_size == 1 && single.ok())
      if (std::optional<PassResult> base = sum_of_passes(single)) {
        t->speedup = base->time_ms.median / t->time_ms.median;
        t->efficiency = t->speedup / std::max(1, r.world_size);
      }
  return t;
}

std::vector<PassResult> shown_passes(const CaseResult& c, const RunResult& r) {
  std::vector<PassResult> out(r.passes.begin(), r.passes.end());
  if (std::optional<PassResult> t = total_pass(c, r); t && t->pass == "fwd+bwd") out.push_back(*t);
  return out;
}

std::optional<PassResult> headline_pass(const CaseResult& c, const RunResult& r) {
  if (std::optional<PassResult> t = total_pass(c, r)) return t;
  for (const char* name : {"bwd", "fwd"})
    if (const PassResult* p = r.pass(name)) return *p;
  return std::nullopt;
}

uint64_t max_peak_bytes(const RunResult& r) { return max_sent_bytes(r.peak_bytes); }

uint64_t max_sent_bytes(const std::vector<uint64_t>& per_rank) {
  return per_rank.empty() ? 0 : *std::max_element(per_rank.begin(), per_rank.end());
}

double load_imbalance(const RunResult& r) {
  if (r.total_pairs <= 0 || r.max_rank_pairs <= 0) return 0;
  return static_cast<double>(r.max_rank_pairs) * r.world_size / r.total_pairs;
}

std::vector<double> medians(const std::vector<Stats>& per_rank) {
  std::vector<double> out;
  for (const Stats& s : per_rank) out.push_back(s.median);
  return out;
}

std::vector<double> rank_medians(const PassResult& p) { return medians(p.ranks); }

std::string board_readings(const PassResult& p) {
  if (p.sm_clock_mhz.empty() || p.power_w.size() != p.sm_clock_mhz.size()) return "";
  std::string line = p.sm_clock_mhz.size() == 1 ? "board: " : "boards by rank: ";
  for (size_t r = 0; r < p.sm_clock_mhz.size(); ++r)
    line += (r ? ", " : "") + std::to_string(std::lround(p.sm_clock_mhz[r].median)) + " MHz " +
            std::to_string(std::lround(p.power_w[r].median)) + " W";
  return line;
}

std::string rank_spread(const PassResult& p) {
  const std::vector<double> m = rank_medians(p);
  if (m.size() < 2) return "";
  const auto slowest = std::max_element(m.begin(), m.end());
  if (*slowest - *std::min_element(m.begin(), m.end()) <= 0.02 * *slowest) return "";
  std::string line = "medians by rank: ";
  for (size_t r = 0; r < m.size(); ++r) line += (r ? ", " : "") + fmt::ms(m[r]);
  return line + ", rank " + std::to_string(slowest - m.begin()) + " the slowest";
}

namespace {

using Intervals = std::vector<std::pair<double, double>>;  // [begin, end), microseconds

Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& [b, e] : v)
    if (!out.empty() && b <= out.back().second) out.back().second = std::max(out.back().second, e);
    else out.emplace_back(b, e);
  return out;
}

double length(const Intervals& v) {
  double n = 0;
  for (const auto& [b, e] : v) n += e - b;
  return n;
}

// Length of `a` outside `b` (both merged).
double uncovered(const Intervals& a, const Intervals& b) {
  double n = 0;
  for (const auto& [lo, hi] : a) {
    double at = lo;
    for (const auto& [b0, b1] : b) {
      if (b1 <= at) continue;
      if (b0 >= hi) break;
      if (b0 > at) n += b0 - at;
      at = std::max(at, b1);
      if (at >= hi) break;
    }
    if (at < hi) n += hi - at;
  }
  return n;
}

}  // namespace

std::optional<CommExposure> exposed_communication(const RunResult& r, const std::string& host_range) {
  // A plugin that marks no compute range says nothing of what its transfers overlap: all of them
  // would read as exposed (a CPU run's blocking receives, waiting for the peer's compute, read as
  // communication longer than the pass's median).
  if (std::none_of(r.trace.begin(), r.trace.end(), [](const TraceEvent& e) { return e.category == "compute"; }))
    return std::nullopt;
  std::optional<CommExposure> worst;
  for (int rank = 0; rank < r.world_size; ++rank) {
    const auto range = std::find_if(r.trace.begin(), r.trace.end(), [&](const TraceEvent& e) {
      return e.rank == rank && e.category == "host" && e.name == host_range;
    });
    if (range == r.trace.end()) continue;
    const double lo = range->start_us, hi = range->start_us + range->duration_us;
    Intervals comm, compute;
    for (const TraceEvent& e : r.trace) {
      const double b = std::max(lo, e.start_us), end = std::min(hi, e.start_us + e.duration_us);
      if (e.rank != rank || end <= b) continue;
      if (e.category == "communication") comm.emplace_back(b, end);
      if (e.category == "compute") compute.emplace_back(b, end);
    }
    if (comm.empty()) continue;
    comm = merged(std::move(comm));
    const CommExposure x{length(comm) / 1e3, uncovered(comm, merged(std::move(compute))) / 1e3};
    if (!worst || x.exposed_ms > worst->exposed_ms) worst = x;
  }
  return worst;
}

std::string check_cell(const RunResult& r) { return !r.check.ran ? "-" : r.check.ok ? "ok" : "FAILED"; }

std::string pass_label(const std::string& pass) { return pass == "fwd_bwd" ? "fwd+bwd" : pass; }

bool all_on_cpu(const std::vector<CaseResult>& cases) {
  return !cases.empty() && std::all_of(cases.begin(), cases.end(), [](const CaseResult& c) { return c.device == "cpu"; });
}

std::string flops_heading(bool cpu) { return cpu ? "GFLOP/s/rank" : "TFLOP/s/GPU"; }

std::string flops_cell(double tflops_per_gpu, bool cpu) { return fmt::sig(cpu ? tflops_per_gpu * 1e3 : tflops_per_gpu); }

}  // namespace attnhost::report
