// What a run produces: plain records, written once by the runner (runtime/) and read by every
// reporter (report/), owned by neither (nvbench's way: measurement once, printers only print).
#pragma once

#include "suite/suite.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace attnhost {

struct Stats {
  int count = 0;
  double min = 0, median = 0, mean = 0, stddev = 0, rel_noise = 0, p10 = 0, p90 = 0, max = 0;
  std::vector<double> samples;  // milliseconds, in the order taken
  std::string stop_reason;      // why sampling stopped (adaptive: "noise 1.2% < 2%", "time limit")
};
Stats summarize(std::vector<double> samples_ms);

// A kernel's share of a pass (timing method "profiler").
struct KernelTime {
  std::string name;
  int64_t launches = 0;
  double total_ms = 0, mean_ms = 0, share = 0;
};

struct PassResult {
  std::string pass;          // fwd | bwd | fwd_bwd
  Stats time_ms;             // per sample: the maximum over ranks
  double flops = 0;          // FlashAttention convention
  double tflops_per_gpu = 0; // from the median
  double tokens_per_s = 0;   // from the median
  double speedup = 0;        // median(world size 1) / median(this world size); 0 when unknown
  double efficiency = 0;     // speedup / world size
  std::vector<KernelTime> kernels;
  std::vector<double> round_medians;  // timing.rounds > 1: each round's median, in the order run
  // World size > 1: each rank's own pass times, rank 0 first: its stream's, from the start all ranks
  // share (time_ms takes the slowest of them a sample). Which rank sets the pace, and by how much.
  std::vector<Stats> ranks;
  // Each rank's GPU board read after each sample (Device::read_board), rank 0 first, at every world
  // size: its SM clock in MHz and its power draw in W. Empty where a board was not read (the CPU).
  std::vector<Stats> sm_clock_mhz, power_w;
};

struct TensorCheck {
  std::string tensor;        // O, LSE, dQ, dK, dV
  int64_t values = 0;        // compared against the float64 reference
  int64_t nonfinite = 0;     // NaN/Inf in the whole output (every element, not only samples)
  double max_abs_err = 0;    // max |x - ref|
  double max_ref = 0;        // max |ref|
  double rel_l2_err = 0;     // ||x - ref|| / ||ref||
  double tol_rel_l2 = 0, tol_max = 0;
  std::string worst;         // where the largest error is: "b=0 h=3 t=1021 d=7"
  bool ok = true;
};

struct CheckResult {
  bool ran = false;
  bool ok = true;
  int64_t rows = 0, columns = 0; // sampled query rows and key columns
  std::vector<TensorCheck> tensors;
  std::string note;              // e.g. why fewer columns than asked were checked
  std::string amax;              // FP8: the outputs' amax (largest over ranks) and whether the plugin's matched
};

struct TraceEvent {
  int rank = 0;
  std::string name;
  std::string category;          // compute | communication | host
  double start_us = 0, duration_us = 0;
};

// One world size of one case.
struct RunResult {
  int world_size = 1;
  std::string status = "PASSED"; // PASSED OK(unchecked) FAILED ERROR OOM UNSUPPORTED SKIPPED CRASHED TIMEOUT
  std::string error;             // one line, for anything but PASSED
  std::string engine;            // what served the attention, as the plugin said ("engine: ...")
  std::vector<PassResult> passes;
  int64_t total_pairs = 0, max_rank_pairs = 0;
  std::vector<uint64_t> peak_bytes;     // per rank
  std::vector<uint64_t> sent_bytes_fwd; // per rank, one forward
  std::vector<uint64_t> sent_bytes_bwd; // per rank, one backward
  CheckResult check;
  std::vector<TraceEvent> trace;        // one traced iteration (forward then backward)
  double wall_seconds = 0;
  // Its ranks shared GPUs (--ranks-per-gpu, a world larger than the GPUs): checked, timed, but no
  // speedup or efficiency against world size 1 is made of its times.
  bool shared_gpus = false;
  bool ok() const { return status == "PASSED" || status == "OK"; }  // timed (OK: unchecked)
  const PassResult* pass(const std::string& name) const {
    for (const auto& p : passes)
      if (p.pass == name) return &p;
    return nullptr;
  }
};

struct CaseResult {
  suite::Case spec;               // the case as run (varlen lengths resolved)
  std::string plugin_version;
  std::string device;             // "cpu" or "cuda:NVIDIA H200"
  std::string engine;             // reported by the plugin's log, when it says
  std::vector<RunResult> runs;
  bool failed() const;            // any run not PASSED (SKIPPED and UNSUPPORTED do not fail)
};

struct Environment {
  std::string attnhost_version, git_revision, device, driver, cuda, nccl, cudnn, host, date;
  int gpus = 0;
  std::vector<std::string> argv;
  std::map<std::string, std::string> plugins; // name -> version
  struct PluginFile {
    std::string file, build;  // the library loaded; how it was compiled ("Release, optimized")
  };
  std::map<std::string, PluginFile> plugin_files;  // name -> where it came from
};

}  // namespace attnhost
