// Figures every reporter shows that are read off the records, never measured again: the
// fwd+bwd total of a run, its busiest rank's memory and traffic, its load imbalance.
#pragma once

#include "results/records.h"

#include <optional>
#include <string>
#include <vector>

namespace attnhost::report {

bool run_failed(const RunResult& r);  // neither ok nor a run that did not apply (SKIPPED, UNSUPPORTED)

// The time of one training step's attention: the measured fwd_bwd pass when the case timed it,
// else the sum of the fwd and bwd medians (pass "fwd+bwd", count 0: a sum has no samples).
// Speedup and efficiency are against world size 1 of the same case, as the runner's are.
std::optional<PassResult> total_pass(const CaseResult& c, const RunResult& r);

// The passes a report shows for a run: those measured, then the total when it is a sum.
std::vector<PassResult> shown_passes(const CaseResult& c, const RunResult& r);

// The headline figure of a run: fwd_bwd, else the fwd+bwd sum, else bwd, else fwd.
std::optional<PassResult> headline_pass(const CaseResult& c, const RunResult& r);

uint64_t max_peak_bytes(const RunResult& r);
uint64_t max_sent_bytes(const std::vector<uint64_t>& per_rank);
double load_imbalance(const RunResult& r);   // busiest rank's pairs over the mean; 0 unknown
std::vector<double> rank_medians(const PassResult& p);  // each rank's own median, rank 0 first
// "medians by rank: 21.600 ms, 21.950 ms, rank 1 the slowest" where the ranks' medians differ by more
// than 2% of the slowest's, else empty: one rank setting a pass's pace, by its share or its GPU.
std::string rank_spread(const PassResult& p);
std::vector<double> medians(const std::vector<Stats>& per_rank);  // rank 0 first
// "boards by rank: 1620 MHz 654 W, 1668 MHz 657 W" ("board: ..." for one rank): the median SM clock
// and power each rank's GPU reported after the samples; empty where none was read.
std::string board_readings(const PassResult& p);

// The traced iteration's communication in one host range ("forward" or "backward") on the rank
// where most of it is exposed: the time some communication range is open, and the part of it that
// no compute range of that rank covers (what the overlap did not hide). Empty without a trace,
// without communication in that range, or when the plugin marks no compute range at all.
struct CommExposure {
  double comm_ms = 0, exposed_ms = 0;
};
std::optional<CommExposure> exposed_communication(const RunResult& r, const std::string& host_range);

std::string check_cell(const RunResult& r);  // "ok", "FAILED", "-" (not checked)

// Throughput in a unit the figures read well in: TFLOP/s a GPU, GFLOP/s a rank on the CPU (where a
// run does a few GFLOP/s). `cpu`: every case shown ran on the CPU.
bool all_on_cpu(const std::vector<CaseResult>& cases);
std::string flops_heading(bool cpu);                   // "TFLOP/s/GPU" or "GFLOP/s/rank"
std::string flops_cell(double tflops_per_gpu, bool cpu);
std::string pass_label(const std::string& pass); // fwd_bwd -> fwd+bwd

}  // namespace attnhost::report
