#include "runtime/rank_state.h"

#if ATTNHOST_HAVE_CUDA
#include "runtime/kernel_profiler.h"
#endif

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <sstream>

namespace attnhost {

namespace {

// One timed sample, aligned across ranks; returns the maximum over ranks.
double sample(RankState& state, const std::function<void()>& work) {
  state.env.group.barrier();
  state.env.device.flush_l2();
  void* s = state.env.device.stream(0);
  auto start = state.env.device.marker(), stop = state.env.device.marker();
  start->record(s);
  state.attempt(work);
  stop->record(s);
  state.attempt([&] { state.env.device.synchronize(); });
  return state.failure ? 0.0 : stop->since(*start);
}

#if ATTNHOST_HAVE_CUDA
std::vector<KernelTime> profile_kernels(RankState& state, const std::function<void()>& work) {
  KernelProfiler& profiler = KernelProfiler::instance();
  void* s = state.env.device.stream(0);
  auto t0 = state.env.device.marker(), t1 = state.env.device.marker();
  std::vector<KernelRecord> records;
  double total = 0, kept = 0;  // this rank's pass time in the kept round, and the slowest rank's
  // Three rounds, keeping the shorter of the last two: a pass right after CUPTI turns its records
  // on can pay CUPTI's start-up on the host (on an H200 a ring forward of 2048 tokens showed
  // kernels in 1% of the pass, a backward in 31%), and a later one now and then a stall of the
  // host in a launch (a ring forward of 0.87 ms of kernels measured 4.6 ms once in 15 runs on an
  // H100): neither is the pass's own time. Every rank keeps the same round.
  for (int round = 0; round < 3; ++round) {
    state.env.group.barrier();  // every rank's records cover the same pass
    state.attempt([&] { profiler.begin(); });
    state.env.group.barrier();
    t0->record(s);
    state.attempt(work);
    t1->record(s);
    state.attempt([&] { state.env.device.synchronize(); });
    state.env.group.barrier();
    profiler.end();
    state.env.group.barrier();
    std::vector<KernelRecord> got = profiler.take(state.env.device.ordinal());
    const double own = state.failure ? 0.0 : t1->since(*t0);
    const double slowest = state.env.group.max({own})[0];
    if (round == 1 || (round == 2 && slowest < kept)) {
      records = std::move(got);
      total = own;
      kept = slowest;
    }
  }
  if (state.failure) state.raise();
  std::vector<KernelTime> out;
  for (const KernelRecord& r : records) {
    auto it = std::find_if(out.begin(), out.end(), [&](const KernelTime& k) { return k.name == r.name; });
    if (it == out.end()) {
      out.push_back({r.name});
      it = out.end() - 1;
    }
    it->launches += 1;
    it->total_ms += (r.end_ns - r.start_ns) * 1e-6;
  }
  for (KernelTime& k : out) {
    k.mean_ms = k.total_ms / std::max<int64_t>(1, k.launches);
    k.share = total > 0 ? k.total_ms / total : 0;
  }
  std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) { return a.total_ms > b.total_ms; });
  return out;
}
#endif

// Per-kernel breakdown of one pass: CUPTI's kernel records on a GPU; on the CPU (or without
// CUPTI) the plugin's named ranges, each range a "kernel".
std::vector<KernelTime> profile(RankState& state, Tracer& tracer, const std::function<void()>& work) {
#if ATTNHOST_HAVE_CUDA
  if (state.env.device.kind() == DeviceKind::cuda && KernelProfiler::instance().unavailable().empty())
    return profile_kernels(state, work);
#endif
  tracer.start(state.env.device.stream(0));
  auto t0 = state.env.device.marker(), t1 = state.env.device.marker();
  t0->record(state.env.device.stream(0));
  state.attempt(work);
  t1->record(state.env.device.stream(0));
  std::vector<TraceEvent> events = tracer.stop();
  if (state.failure) state.raise();  // profile needs no other rank: a failure is this rank's alone
  double total = t1->since(*t0);
  std::vector<KernelTime> out;
  for (const TraceEvent& e : events) {
    std::string name = e.name;
    while (!name.empty() && std::isdigit(static_cast<unsigned char>(name.back()))) name.pop_back();  // "step 3" -> "step "
    auto it = std::find_if(out.begin(), out.end(), [&](const KernelTime& k) { return k.name == name; });
    if (it == out.end()) { out.push_back({name}); it = out.end() - 1; }
    it->launches += 1;
    it->total_ms += e.duration_us / 1000.0;
  }
  for (KernelTime& k : out) {
    k.mean_ms = k.total_ms / std::max<int64_t>(1, k.launches);
    k.share = total > 0 ? k.total_ms / total : 0;
  }
  return out;
}

}  // namespace

PassResult time_pass(RankState& state, Tracer& tracer, const std::string& pass) {
  std::function<void()> work;
  if (pass == "fwd") work = [&] { state.forward(); };
  else if (pass == "bwd") work = [&] { state.backward(); };
  else work = [&] { state.forward(); state.backward(); };
  if (pass == "bwd") state.attempt([&] {  // backward reads the forward's outputs
    state.forward();
    state.env.device.synchronize();
  });
  const suite::Timing& t = state.c.timing;
  state.env.comm.reset_bytes_sent();
  // At least one untimed call in every method: one-time setup (cuDNN's graph builds, first
  // allocations) never lands in a sample. Then warm-ups until both their count and their time
  // (warmup_seconds: the GPU's clock settled at its power limit) are reached.
  const int warmups = std::max(1, t.method == "simple" ? 0 : t.warmup_runs);
  const auto warm_start = std::chrono::steady_clock::now();
  const auto warm_enough = [&](int done) {
    if (done < warmups) return false;
    if (t.warmup_seconds <= 0) return true;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - warm_start).count();
    return state.env.group.max({elapsed})[0] >= t.warmup_seconds;  // every rank decides alike
  };
  // The first call also measures what one call sends (warm-up or, with none, the sample).
  bool measured_bytes = false;
  // fwd_bwd sends what fwd and bwd send; it measures nothing of its own.
  auto note_bytes = [&] {
    if (measured_bytes || pass == "fwd_bwd") return;
    (pass == "bwd" ? state.sent_bwd : state.sent_fwd) = state.env.comm.bytes_sent();
    measured_bytes = true;
  };
  // A fwd_bwd pass with no fwd or bwd pass of its own measures their bytes in its first
  // warm-up, run in two halves.
  const bool split_first = pass == "fwd_bwd" && state.sent_fwd == 0 && state.sent_bwd == 0 && state.env.world_size > 1;
  for (int i = 0; !warm_enough(i); ++i) {
    if (i == 0 && split_first) {
      state.attempt([&] {
        state.forward();
        state.env.device.synchronize();
        state.sent_fwd = state.env.comm.bytes_sent();
        state.env.comm.reset_bytes_sent();
        state.backward();
        state.env.device.synchronize();
        state.sent_bwd = state.env.comm.bytes_sent();
      });
      continue;
    }
    state.attempt([&] {
      work();
      state.env.device.synchronize();
    });
    note_bytes();
  }
  state.all_ok();
  std::vector<double> samples;
  const int world = state.env.group.size(), rank = state.env.group.rank();
  std::vector<std::vector<double>> by_rank(world > 1 ? world : 0), clock(world), power(world);
  std::string stop_reason;
  auto t0 = std::chrono::steady_clock::now();
  const int fixed = t.method == "simple" ? 1 : t.timing_runs;
  const int hard_cap = 10000;
  while (true) {
    double ms = sample(state, work);
    note_bytes();
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Every rank decides on the same numbers; its own time and its board's reading ride along in
    // slots of their own (0: not read).
    const std::optional<GpuReading> board = state.env.device.read_board();
    const size_t times = 3, boards = times + by_rank.size();
    std::vector<double> mine = {ms, elapsed, state.failure ? 1.0 : 0.0};
    mine.resize(boards + 2 * world, 0.0);
    if (!by_rank.empty()) mine[times + rank] = ms;
    if (board) {
      mine[boards + rank] = board->sm_clock_mhz;
      mine[boards + world + rank] = board->power_w;
    }
    std::vector<double> m = state.env.group.max(mine);
    if (m[2] > 0) state.raise();
    samples.push_back(m[0]);
    for (size_t r = 0; r < by_rank.size(); ++r) by_rank[r].push_back(m[times + r]);
    for (int r = 0; r < world; ++r)
      if (m[boards + r] > 0) {
        clock[r].push_back(m[boards + r]);
        power[r].push_back(m[boards + world + r]);
      }
    if (t.method != "adaptive") {
      if (static_cast<int>(samples.size()) >= fixed) { stop_reason = std::to_string(fixed) + " runs"; break; }
      continue;
    }
    Stats st = summarize(samples);
    if (static_cast<int>(samples.size()) >= t.min_samples && st.rel_noise <= t.target_noise) {
      std::ostringstream s;
      s << "noise " << std::round(st.rel_noise * 1000) / 10 << "% <= " << t.target_noise * 100 << "% after "
        << samples.size() << " samples";
      stop_reason = s.str();
      break;
    }
    if (m[1] >= t.max_seconds || static_cast<int>(samples.size()) >= hard_cap) {
      std::ostringstream s;
      s << "time limit " << t.max_seconds << " s reached with noise " << std::round(st.rel_noise * 1000) / 10 << "%";
      stop_reason = s.str();
      break;
    }
  }
  PassResult r;
  r.pass = pass;
  r.time_ms = summarize(samples);
  r.time_ms.stop_reason = stop_reason;
  for (std::vector<double>& own : by_rank) r.ranks.push_back(summarize(std::move(own)));
  // Only where every rank's board answered every sample: the columns line up with the ranks.
  const auto every = [&](const std::vector<double>& x) { return x.size() == samples.size(); };
  if (std::all_of(clock.begin(), clock.end(), every))
    for (int i = 0; i < world; ++i) {
      r.sm_clock_mhz.push_back(summarize(std::move(clock[i])));
      r.power_w.push_back(summarize(std::move(power[i])));
    }
  if (t.method == "profiler") r.kernels = profile(state, tracer, work);
  return r;
}

}  // namespace attnhost
