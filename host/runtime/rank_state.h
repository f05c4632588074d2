// What one rank's run of a case holds while it goes through its phases (runner.cpp): the problem,
// the plugin instance, the local tensors and the call arguments over them, and the rule by which a
// failure on one rank reaches all. Each phase is a function of its own over this state:
//   setup   rank_setup.cpp    the local tensors, the deterministic data, the call arguments
//   timing  rank_timing.cpp   warm-ups and timed samples of each pass, the profiler's breakdown
//   trace   rank_trace.cpp    one traced iteration, every rank's events gathered on rank 0
//   check   rank_check.cpp    the outputs once more, sampled against the float64 reference
//   summary rank_summary.cpp  peak memory, bytes sent and attended pairs of every rank, FLOP rates
#pragma once

#include "plugins/loaded_plugin.h"
#include "results/records.h"
#include "runtime/backend.h"
#include "runtime/data.h"
#include "runtime/services.h"
#include "suite/suite.h"

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace attnhost {

// Thrown on a rank that is fine when another rank failed: the failing rank's message is the one
// the case reports.
struct PeerFailed {};

// The local tensors of one rank, allocated from the rank's Device (and so accounted).
struct Buffers {
  Device& device;
  std::vector<void*> owned;
  void* q = nullptr; void* k = nullptr; void* v = nullptr; void* o = nullptr; void* lse = nullptr;
  void* d_o = nullptr; void* dq = nullptr; void* dk = nullptr; void* dv = nullptr;
  size_t nq = 0, nkv = 0, nlse = 0;  // elements of Q (and O, dO, dQ), of K (V, dK, dV), of LSE
  explicit Buffers(Device& d) : device(d) {}
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    for (void* p : owned) device.free(p);
  }
  void* take(size_t bytes) {
    void* p = device.alloc(bytes);
    owned.push_back(p);
    return p;
  }
};

struct RankState {
  RankState(const suite::Case& c, RankEnv& env, const attnhost_problem& problem)
      : c(c), env(env), problem(problem), buffers(env.device) {}

  const suite::Case& c;
  RankEnv& env;
  attnhost_problem problem;
  data::Params data;
  std::unique_ptr<Instance> instance;
  Instance::Layout lq, lkv;
  Buffers buffers;
  attnhost_forward_args fwd{};
  attnhost_backward_args bwd{};
  attnhost_fp8_scaling fp8{};            // an FP8 problem's descales, which fwd and bwd point to
  attnhost_fp8_amax* amax = nullptr;     // an FP8 problem's output amax, in the rank's device memory
  bool gradients = false;                // the backward runs (timed or checked)
  uint64_t sent_fwd = 0, sent_bwd = 0;   // bytes this rank sends in one pass
  std::exception_ptr failure;

  void forward() { instance->forward(fwd); }
  void backward() { instance->backward(bwd); }

  // Plugin calls inside a phase that also talks to the other ranks: a failure is kept until the
  // next all_ok(), so every rank still reaches the same host collectives in the same order.
  void attempt(const std::function<void()>& fn) {
    if (failure) return;
    try {
      fn();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Every rank learns whether any failed; the failing rank rethrows its own error.
  void all_ok(double flag_or_zero = -1) {
    double failed = failure ? 1.0 : 0.0;
    if (flag_or_zero >= 0) failed = std::max(failed, flag_or_zero);
    if (env.group.max({failed})[0] == 0) return;
    raise();
  }
  [[noreturn]] void raise() {
    if (failure) {
      std::exception_ptr e = failure;
      failure = nullptr;
      std::rethrow_exception(e);
    }
    throw PeerFailed{};
  }
};

// The phases, in the order a run takes them.
void setup_rank(RankState& s);
PassResult time_pass(RankState& s, Tracer& tracer, const std::string& pass);
void trace_iteration(RankState& s, Tracer& tracer, RunResult& result);
void check_outputs(RankState& s, RunResult& result);
void summarize_ranks(RankState& s, RunResult& result);

}  // namespace attnhost
