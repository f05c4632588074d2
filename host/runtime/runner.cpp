#include "runtime/runner.h"

#include "common/errors.h"
#include "common/log.h"
#include "runtime/check.h"
#if ATTNHOST_HAVE_CUDA
#include "runtime/kernel_profiler.h"
#endif
#include "runtime/problem.h"
#include "runtime/services.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

namespace attnhost {

namespace {

// Ends a run on every rank with the same status (thrown after RankGroup::agree).
struct RunAbort {
  std::string status, message;
};

// Thrown on a rank that is fine when another rank failed: the failing rank's message is the
// one the case reports.
struct PeerFailed {};

std::string classify(const std::exception& e, std::string& status) {
  if (dynamic_cast<const OutOfMemory*>(&e)) {
    status = "OOM";
  } else if (auto* p = dynamic_cast<const PluginError*>(&e)) {
    status = p->code == ATTNHOST_ERR_OUT_OF_MEMORY ? "OOM" : p->code == ATTNHOST_ERR_UNSUPPORTED ? "UNSUPPORTED" : "ERROR";
  } else {
    status = "ERROR";
  }
  return e.what();
}

// Runs f on this rank; then every rank learns whether any rank failed, and all abort together.
template <class F>
void phase(RankEnv& env, const char* name, F f, const RankServices* services = nullptr) {
  std::string status, message;
  try {
    f();
  } catch (const PeerFailed&) {
  } catch (const std::exception& e) {
    message = std::string(name) + ": " + classify(e, status);
    // A plugin error that followed a failing host service: say what the host saw too.
    if (services && !services->last_failure().empty() && message.find(services->last_failure()) == std::string::npos)
      message += " (host: " + services->last_failure() + ")";
    if (services && services->last_status() == ATTNHOST_ERR_OUT_OF_MEMORY) status = "OOM";
  } catch (...) {
    status = "ERROR";
    message = std::string(name) + ": unknown exception";
  }
  std::string agreed = env.group.agree(message.empty() ? "" : status + "\t" + message);
  if (agreed.empty()) return;
  std::string::size_type tab = agreed.find('\t');
  if (tab == std::string::npos) throw RunAbort{"ERROR", agreed};
  // agree() prefixes "rank R: " in multi-rank worlds; keep it in front of the message.
  std::string prefix, rest = agreed;
  if (agreed.rfind("rank ", 0) == 0) {
    auto colon = agreed.find(": ");
    prefix = agreed.substr(0, colon + 2);
    rest = agreed.substr(colon + 2);
    tab = rest.find('\t');
  }
  throw RunAbort{rest.substr(0, tab), prefix + rest.substr(tab + 1)};
}

// The local tensors of one rank, allocated from the rank's Device (and so accounted).
struct Buffers {
  Device& device;
  std::vector<void*> owned;
  void* q = nullptr; void* k = nullptr; void* v = nullptr; void* o = nullptr; void* lse = nullptr;
  void* d_o = nullptr; void* dq = nullptr; void* dk = nullptr; void* dv = nullptr;
  explicit Buffers(Device& d) : device(d) {}
  ~Buffers() {
    for (void* p : owned) device.free(p);
  }
  void* take(size_t bytes) {
    void* p = device.alloc(bytes);
    owned.push_back(p);
    return p;
  }
};

attnhost_tensor make_tensor(void* data, const attnhost_problem& p, int32_t dtype, std::vector<int64_t> shape, int device_id) {
  attnhost_tensor t{};
  t.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_tensor, strides);
  t.data = data;
  t.device_type = p.device_type;
  t.device_id = device_id;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  return t;
}

class RankRun {
 public:
  RankRun(const suite::Case& c, const Plugin& plugin, const ProblemBinding& binding, RankEnv& env,
          const RunnerOptions& options)
      : c_(c), plugin_(plugin), env_(env), options_(options), problem_(binding.at(env.rank, env.world_size, env.local_rank, env.local_size)),
        tracer_(env.device, env.rank), services_(env.device, env.comm, tracer_, env.rank), buffers_(env.device) {
    data_.seed = c.data.seed;
    data_.distribution = c.data.distribution == "uniform" ? data::kUniform : data::kNormal;
    data_.scale = static_cast<float>(c.data.scale);
  }

  RunResult run() {
    RunResult result;
    result.world_size = env_.world_size;
    auto wall0 = std::chrono::steady_clock::now();
    try {
      phase(env_, "create", [&] { instance_ = plugin_.create(problem_, services_.api()); }, &services_);
      phase(env_, "setup", [&] { setup(); }, &services_);
      gradients_ = instance_->has_backward() && wants_backward();
      for (const std::string& pass : c_.timing.passes) {
        if (pass != "fwd" && !instance_->has_backward()) continue;
        PassResult pr;
        phase(env_, pass.c_str(), [&] { pr = time_pass(pass); }, &services_);
        result.passes.push_back(std::move(pr));
      }
      if (options_.trace) phase(env_, "trace", [&] { traced_iteration(result); }, &services_);
      if (c_.check.enabled) phase(env_, "check", [&] { check(result); }, &services_);
      else result.status = "OK";
      phase(env_, "summary", [&] { summarize_ranks(result); }, &services_);
    } catch (const RunAbort& a) {
      result.status = a.status;
      result.error = a.message;
    }
    instance_.reset();  // the instance frees its workspace before the buffers go
    result.engine = services_.engine_note();
    result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return result;
  }

 private:
  bool wants_backward() const {
    for (const std::string& p : c_.timing.passes)
      if (p != "fwd") return true;
    return c_.check.enabled;  // the check covers gradients whenever the plugin has them
  }

  void setup() {
    lq_ = instance_->layout(ATTNHOST_LAYOUT_Q);
    lkv_ = instance_->layout(ATTNHOST_LAYOUT_KV);
    const bool packed = problem_.num_seqs > 0;
    const int64_t B = problem_.batch, D = problem_.head_dim;
    const size_t el = dtype_bytes(problem_.dtype);
    const size_t nq = static_cast<size_t>(B) * lq_.local_tokens * problem_.heads_q * D;
    const size_t nkv = static_cast<size_t>(B) * lkv_.local_tokens * problem_.heads_kv * D;
    const size_t nlse = static_cast<size_t>(B) * problem_.heads_q * lq_.local_tokens;
    b_.q = buffers_.take(nq * el);
    b_.k = buffers_.take(nkv * el);
    b_.v = buffers_.take(nkv * el);
    b_.o = buffers_.take(nq * el);
    b_.lse = buffers_.take(nlse * 4);
    b_.d_o = buffers_.take(nq * el);
    if (instance_->has_backward()) {
      b_.dq = buffers_.take(nq * el);
      b_.dk = buffers_.take(nkv * el);
      b_.dv = buffers_.take(nkv * el);
    }
    auto gen = [&](void* dst, uint32_t tensor, const Instance::Layout& l, int32_t heads) {
      GenerateSpec s{data_, tensor, problem_.dtype, B, l.local_tokens, heads, problem_.head_dim, l.ranges};
      env_.device.generate(dst, s);
    };
    gen(b_.q, data::kQ, lq_, problem_.heads_q);
    gen(b_.k, data::kK, lkv_, problem_.heads_kv);
    gen(b_.v, data::kV, lkv_, problem_.heads_kv);
    gen(b_.d_o, data::kDO, lq_, problem_.heads_q);
    // Outputs start as NaN: an element the plugin never writes cannot pass the check.
    env_.device.poison(b_.o, problem_.dtype, nq);
    env_.device.poison(b_.lse, ATTNHOST_DTYPE_FP32, nlse);

    const int dev = env_.device.ordinal();
    auto qshape = [&](int32_t heads, const Instance::Layout& l) {
      return packed ? std::vector<int64_t>{l.local_tokens, heads, D} : std::vector<int64_t>{B, l.local_tokens, heads, D};
    };
    std::vector<int64_t> lse_shape = packed ? std::vector<int64_t>{problem_.heads_q, lq_.local_tokens}
                                            : std::vector<int64_t>{B, problem_.heads_q, lq_.local_tokens};
    int32_t dt = problem_.dtype;
    fwd_.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_forward_args, lse);
    fwd_.q = make_tensor(b_.q, problem_, dt, qshape(problem_.heads_q, lq_), dev);
    fwd_.k = make_tensor(b_.k, problem_, dt, qshape(problem_.heads_kv, lkv_), dev);
    fwd_.v = make_tensor(b_.v, problem_, dt, qshape(problem_.heads_kv, lkv_), dev);
    fwd_.o = make_tensor(b_.o, problem_, dt, qshape(problem_.heads_q, lq_), dev);
    fwd_.lse = make_tensor(b_.lse, problem_, ATTNHOST_DTYPE_FP32, lse_shape, dev);
    bwd_.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_backward_args, dv);
    bwd_.q = fwd_.q; bwd_.k = fwd_.k; bwd_.v = fwd_.v; bwd_.o = fwd_.o; bwd_.lse = fwd_.lse;
    bwd_.d_o = make_tensor(b_.d_o, problem_, dt, qshape(problem_.heads_q, lq_), dev);
    bwd_.dq = make_tensor(b_.dq, problem_, dt, qshape(problem_.heads_q, lq_), dev);
    bwd_.dk = make_tensor(b_.dk, problem_, dt, qshape(problem_.heads_kv, lkv_), dev);
    bwd_.dv = make_tensor(b_.dv, problem_, dt, qshape(problem_.heads_kv, lkv_), dev);
    sizes_ = {nq, nkv, nlse};
  }

  void forward() { instance_->forward(fwd_); }
  void backward() { instance_->backward(bwd_); }

  // Plugin calls inside a phase that also talks to the other ranks: a failure is kept until the
  // next all_ok(), so every rank still reaches the same host collectives in the same order.
  void attempt(const std::function<void()>& fn) {
    if (failure_) return;
    try {
      fn();
    } catch (...) {
      failure_ = std::current_exception();
    }
  }
  // Every rank learns whether any failed; the failing rank rethrows its own error.
  void all_ok(double flag_or_zero = -1) {
    double failed = failure_ ? 1.0 : 0.0;
    if (flag_or_zero >= 0) failed = std::max(failed, flag_or_zero);
    if (env_.group.max({failed})[0] == 0) return;
    raise();
  }
  [[noreturn]] void raise() {
    if (failure_) {
      std::exception_ptr e = failure_;
      failure_ = nullptr;
      std::rethrow_exception(e);
    }
    throw PeerFailed{};
  }

  // One timed sample, aligned across ranks; returns the maximum over ranks.
  double sample(const std::function<void()>& work) {
    env_.group.barrier();
    env_.device.flush_l2();
    void* s = env_.device.stream(0);
    auto start = env_.device.marker(), stop = env_.device.marker();
    start->record(s);
    attempt(work);
    stop->record(s);
    attempt([&] { env_.device.synchronize(); });
    return failure_ ? 0.0 : stop->since(*start);
  }

  PassResult time_pass(const std::string& pass) {
    std::function<void()> work;
    if (pass == "fwd") work = [&] { forward(); };
    else if (pass == "bwd") work = [&] { backward(); };
    else work = [&] { forward(); backward(); };
    if (pass == "bwd") attempt([&] {  // backward reads the forward's outputs
      forward();
      env_.device.synchronize();
    });
    const suite::Timing& t = c_.timing;
    env_.comm.reset_bytes_sent();
    // At least one untimed call in every method: one-time setup (cuDNN's graph builds, first
    // allocations) never lands in a sample. Then warm-ups until both their count and their time
    // (warmup_seconds: the GPU's clock settled at its power limit) are reached.
    const int warmups = std::max(1, t.method == "simple" ? 0 : t.warmup_runs);
    const auto warm_start = std::chrono::steady_clock::now();
    const auto warm_enough = [&](int done) {
      if (done < warmups) return false;
      if (t.warmup_seconds <= 0) return true;
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - warm_start).count();
      return env_.group.max({elapsed})[0] >= t.warmup_seconds;  // every rank decides alike
    };
    // The first call also measures what one call sends (warm-up or, with none, the sample).
    bool measured_bytes = false;
    // fwd_bwd sends what fwd and bwd send; it measures nothing of its own.
    auto note_bytes = [&] {
      if (measured_bytes || pass == "fwd_bwd") return;
      (pass == "bwd" ? sent_bwd_ : sent_fwd_) = env_.comm.bytes_sent();
      measured_bytes = true;
    };
    // A fwd_bwd pass with no fwd or bwd pass of its own measures their bytes in its first
    // warm-up, run in two halves.
    const bool split_first = pass == "fwd_bwd" && sent_fwd_ == 0 && sent_bwd_ == 0 && env_.world_size > 1;
    for (int i = 0; !warm_enough(i); ++i) {
      if (i == 0 && split_first) {
        attempt([&] {
          forward();
          env_.device.synchronize();
          sent_fwd_ = env_.comm.bytes_sent();
          env_.comm.reset_bytes_sent();
          backward();
          env_.device.synchronize();
          sent_bwd_ = env_.comm.bytes_sent();
        });
        continue;
      }
      attempt([&] {
        work();
        env_.device.synchronize();
      });
      note_bytes();
    }
    all_ok();
    std::vector<double> samples;
    std::string stop_reason;
    auto t0 = std::chrono::steady_clock::now();
    const int fixed = t.method == "simple" ? 1 : t.timing_runs;
    const int hard_cap = 10000;
    while (true) {
      double ms = sample(work);
      note_bytes();
      double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // Every rank decides on the same numbers.
      std::vector<double> m = env_.group.max({ms, elapsed, failure_ ? 1.0 : 0.0});
      if (m[2] > 0) raise();
      samples.push_back(m[0]);
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
    if (t.method == "profiler") r.kernels = profile(pass, work);
    return r;
  }

  // Per-kernel breakdown of one pass: CUPTI's kernel records on a GPU; on the CPU (or without
  // CUPTI) the plugin's named ranges, each range a "kernel".
  std::vector<KernelTime> profile(const std::string& pass, const std::function<void()>& work) {
#if ATTNHOST_HAVE_CUDA
    if (env_.device.kind() == DeviceKind::cuda && KernelProfiler::instance().unavailable().empty())
      return profile_kernels(work);
#endif
    tracer_.start(env_.device.stream(0));
    auto t0 = env_.device.marker(), t1 = env_.device.marker();
    t0->record(env_.device.stream(0));
    attempt(work);
    t1->record(env_.device.stream(0));
    std::vector<TraceEvent> events = tracer_.stop();
    if (failure_) raise();  // profile needs no other rank: a failure is this rank's alone
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
    (void)pass;
    return out;
  }

#if ATTNHOST_HAVE_CUDA
  std::vector<KernelTime> profile_kernels(const std::function<void()>& work) {
    KernelProfiler& profiler = KernelProfiler::instance();
    void* s = env_.device.stream(0);
    auto t0 = env_.device.marker(), t1 = env_.device.marker();
    std::vector<KernelRecord> records;
    double total = 0, kept = 0;  // this rank's pass time in the kept round, and the slowest rank's
    // Three rounds, keeping the shorter of the last two: a pass right after CUPTI turns its records
    // on can pay CUPTI's start-up on the host (on an H200 a ring forward of 2048 tokens showed
    // kernels in 1% of the pass, a backward in 31%), and a later one now and then a stall of the
    // host in a launch (a ring forward of 0.87 ms of kernels measured 4.6 ms once in 15 runs on an
    // H100): neither is the pass's own time. Every rank keeps the same round.
    for (int round = 0; round < 3; ++round) {
      env_.group.barrier();  // every rank's records cover the same pass
      attempt([&] { profiler.begin(); });
      env_.group.barrier();
      t0->record(s);
      attempt(work);
      t1->record(s);
      attempt([&] { env_.device.synchronize(); });
      env_.group.barrier();
      profiler.end();
      env_.group.barrier();
      std::vector<KernelRecord> got = profiler.take(env_.device.ordinal());
      const double own = failure_ ? 0.0 : t1->since(*t0);
      const double slowest = env_.group.max({own})[0];
      if (round == 1 || (round == 2 && slowest < kept)) {
        records = std::move(got);
        total = own;
        kept = slowest;
      }
    }
    if (failure_) raise();
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

  void traced_iteration(RunResult& result) {
    env_.group.barrier();
    void* s = env_.device.stream(0);
    tracer_.start(s);
    int32_t f = tracer_.begin("forward", "host", s);
    attempt([&] { forward(); });
    tracer_.end(f, s);
    if (gradients_) {
      int32_t b = tracer_.begin("backward", "host", s);
      attempt([&] { backward(); });
      tracer_.end(b, s);
    }
    std::vector<TraceEvent> events;
    attempt([&] { events = tracer_.stop(); });
    all_ok();
    std::ostringstream out;
    for (const TraceEvent& e : events)
      out << e.rank << '\t' << e.category << '\t' << e.start_us << '\t' << e.duration_us << '\t' << e.name << '\n';
    for (const std::string& rank_events : env_.group.gather(out.str())) {
      std::istringstream in(rank_events);
      std::string line;
      while (std::getline(in, line)) {
        std::istringstream f(line);
        TraceEvent e;
        f >> e.rank;
        f.ignore(1);
        std::getline(f, e.category, '\t');
        f >> e.start_us >> e.duration_us;
        f.ignore(1);
        std::getline(f, e.name);
        result.trace.push_back(std::move(e));
      }
    }
  }

  void run_outputs_once() {
    forward();
    if (gradients_) backward();
    env_.device.synchronize();
  }

  int64_t count_nonfinite(void* base, int32_t dtype, const Instance::Layout& l, int32_t heads, bool lse_layout) {
    int64_t bad = 0;
    const int64_t D = problem_.head_dim;
    for (int64_t b = 0; b < problem_.batch; ++b)
      for (const attnhost_token_range& r : l.ranges) {
        if (lse_layout) {
          for (int32_t h = 0; h < heads; ++h) {
            size_t off = (static_cast<size_t>(b) * heads + h) * l.local_tokens + r.local_begin;
            bad += env_.device.count_nonfinite(static_cast<float*>(base) + off, dtype, r.length, true);
          }
        } else {
          size_t off = (static_cast<size_t>(b) * l.local_tokens + r.local_begin) * heads * D;
          bad += env_.device.count_nonfinite(static_cast<char*>(base) + off * dtype_bytes(dtype), dtype,
                                             r.length * heads * D, false);
        }
      }
    return bad;
  }

  void check(RunResult& result) {
    const int32_t dt = problem_.dtype;
    env_.device.poison(b_.o, dt, sizes_[0]);
    env_.device.poison(b_.lse, ATTNHOST_DTYPE_FP32, sizes_[2]);
    if (gradients_) {
      env_.device.poison(b_.dq, dt, sizes_[0]);
      env_.device.poison(b_.dk, dt, sizes_[1]);
      env_.device.poison(b_.dv, dt, sizes_[1]);
    }
    attempt([&] { run_outputs_once(); });
    all_ok();

    std::vector<double> nonfinite = {
        static_cast<double>(count_nonfinite(b_.o, dt, lq_, problem_.heads_q, false)),
        static_cast<double>(count_nonfinite(b_.lse, ATTNHOST_DTYPE_FP32, lq_, problem_.heads_q, true)),
        gradients_ ? static_cast<double>(count_nonfinite(b_.dq, dt, lq_, problem_.heads_q, false)) : 0.0,
        gradients_ ? static_cast<double>(count_nonfinite(b_.dk, dt, lkv_, problem_.heads_kv, false)) : 0.0,
        gradients_ ? static_cast<double>(count_nonfinite(b_.dv, dt, lkv_, problem_.heads_kv, false)) : 0.0};
    nonfinite = env_.group.sum(nonfinite);

    int64_t rank_pairs = 0, total_pairs = 0;
    attempt([&] { instance_->count_pairs(&rank_pairs, &total_pairs); });
    all_ok();
    CheckPlan plan = plan_check(problem_, c_.check, c_.data.seed, total_pairs, gradients_);

    RankOutputs out;
    out.q_layout = lq_;
    out.kv_layout = lkv_;
    out.dtype = dt;
    out.batch = problem_.batch;
    out.heads_q = problem_.heads_q;
    out.heads_kv = problem_.heads_kv;
    out.head_dim = problem_.head_dim;
    const size_t el = dtype_bytes(dt);
    auto fetch = [&](std::vector<char>& dst, const void* src, size_t bytes) {
      dst.resize(bytes);
      env_.device.copy_to_host(dst.data(), src, bytes);
    };
    fetch(out.o, b_.o, sizes_[0] * el);
    fetch(out.lse, b_.lse, sizes_[2] * 4);
    if (gradients_) {
      fetch(out.dq, b_.dq, sizes_[0] * el);
      fetch(out.dk, b_.dk, sizes_[1] * el);
      fetch(out.dv, b_.dv, sizes_[1] * el);
      fetch(out.d_o, b_.d_o, sizes_[0] * el);
    }
    std::vector<std::string> packed = env_.group.gather(pack_samples(plan, out));
    if (env_.rank != 0) return;
    std::vector<std::pair<std::string, int64_t>> counts = {
        {"O", static_cast<int64_t>(nonfinite[0])}, {"LSE", static_cast<int64_t>(nonfinite[1])},
        {"dQ", static_cast<int64_t>(nonfinite[2])}, {"dK", static_cast<int64_t>(nonfinite[3])},
        {"dV", static_cast<int64_t>(nonfinite[4])}};
    result.check = evaluate_check(plan, packed, problem_, data_, *instance_, c_.check, counts);
    if (!result.check.ok) {
      result.status = "FAILED";
      std::ostringstream s;
      for (const TensorCheck& t : result.check.tensors) {
        if (t.ok) continue;
        s << (s.tellp() > 0 ? "; " : "") << t.tensor << ": ";
        if (t.nonfinite) s << t.nonfinite << " non-finite values";
        else s << "max error " << t.max_abs_err << " at " << t.worst << ", rel L2 " << t.rel_l2_err;
      }
      if (!result.check.note.empty() && s.tellp() == 0) s << result.check.note;
      result.error = "check failed: " + s.str();
    }
  }

  void summarize_ranks(RunResult& result) {
    int64_t rank_pairs = 0, total_pairs = 0;
    attempt([&] { instance_->count_pairs(&rank_pairs, &total_pairs); });
    all_ok();
    const int ws = env_.world_size;
    std::vector<double> per_rank(3 * ws + 1, 0.0);
    per_rank[env_.rank] = static_cast<double>(env_.device.peak_bytes());
    per_rank[ws + env_.rank] = static_cast<double>(sent_fwd_);
    per_rank[2 * ws + env_.rank] = static_cast<double>(sent_bwd_);
    per_rank[3 * ws] = static_cast<double>(rank_pairs);
    std::vector<double> all = env_.group.sum(per_rank);
    std::vector<double> most = env_.group.max({static_cast<double>(rank_pairs)});
    result.total_pairs = total_pairs;
    result.max_rank_pairs = static_cast<int64_t>(most[0]);
    for (int r = 0; r < ws; ++r) {
      result.peak_bytes.push_back(static_cast<uint64_t>(all[r]));
      result.sent_bytes_fwd.push_back(static_cast<uint64_t>(all[ws + r]));
      result.sent_bytes_bwd.push_back(static_cast<uint64_t>(all[2 * ws + r]));
    }
    const double fwd_flops = 4.0 * problem_.head_dim * static_cast<double>(total_pairs);
    const double tokens = static_cast<double>(problem_.batch) * problem_.seqlen_q;
    for (PassResult& p : result.passes) {
      p.flops = p.pass == "fwd" ? fwd_flops : p.pass == "bwd" ? 2.5 * fwd_flops : 3.5 * fwd_flops;
      if (p.time_ms.median > 0) {
        p.tflops_per_gpu = p.flops / (p.time_ms.median * 1e-3) / 1e12 / ws;
        p.tokens_per_s = tokens / (p.time_ms.median * 1e-3);
      }
    }
  }

  const suite::Case& c_;
  const Plugin& plugin_;
  RankEnv& env_;
  const RunnerOptions& options_;
  attnhost_problem problem_;
  data::Params data_;
  Tracer tracer_;
  RankServices services_;
  Buffers buffers_;
  std::unique_ptr<Instance> instance_;
  Instance::Layout lq_, lkv_;
  struct { void *q, *k, *v, *o, *lse, *d_o, *dq, *dk, *dv; } b_{};
  std::vector<size_t> sizes_;
  attnhost_forward_args fwd_{};
  attnhost_backward_args bwd_{};
  bool gradients_ = false;
  std::exception_ptr failure_;
  uint64_t sent_fwd_ = 0, sent_bwd_ = 0;
};

bool has_feature(const PluginDescription& d, uint32_t f) { return (d.features & f) != 0; }

}  // namespace

std::string capability_mismatch(const suite::Case& c, const PluginDescription& d, DeviceKind device, int ws) {
  const suite::Problem& p = c.problem;
  const std::string who = "plugin '" + d.name + "' ";
  uint32_t dev_bit = device == DeviceKind::cuda ? ATTNHOST_CAP_DEVICE_CUDA : ATTNHOST_CAP_DEVICE_CPU;
  if (!(d.devices & dev_bit)) return who + "does not run on " + device_kind_name(device) + " (runs on " + devices_string(d.devices) + ")";
  int32_t dt = dtype_from_name(p.dtype);
  if (!(d.dtypes & ATTNHOST_CAP_DTYPE(dt))) return who + "does not support " + p.dtype + " (supports " + dtypes_string(d.dtypes) + ")";
  if (p.causal && !has_feature(d, ATTNHOST_FEATURE_CAUSAL)) return who + "does not support causal attention";
  if (!p.causal && !has_feature(d, ATTNHOST_FEATURE_NONCAUSAL)) return who + "supports causal attention only";
  if ((p.window_left >= 0 || p.window_right >= 0) && !has_feature(d, ATTNHOST_FEATURE_WINDOW))
    return who + "does not support sliding windows";
  int32_t hkv = p.heads_kv > 0 ? p.heads_kv : p.heads_q;
  if (hkv != p.heads_q && !has_feature(d, ATTNHOST_FEATURE_GQA)) return who + "does not support GQA (kv heads < heads)";
  if (p.varlen && !has_feature(d, ATTNHOST_FEATURE_VARLEN)) return who + "does not support variable-length input";
  if (p.seqlen_kv > 0 && p.seqlen_kv != p.seqlen_q && !has_feature(d, ATTNHOST_FEATURE_CROSS))
    return who + "does not support seqlen_kv != seqlen_q";
  if (p.deterministic && !has_feature(d, ATTNHOST_FEATURE_DETERMINISTIC)) return who + "has no deterministic mode";
  if (ws < d.min_world_size || (d.max_world_size > 0 && ws > d.max_world_size))
    return who + "runs at world sizes " + std::to_string(d.min_world_size) + ".." +
           (d.max_world_size > 0 ? std::to_string(d.max_world_size) : std::string("any")) + ", not " + std::to_string(ws);
  if (!d.head_dims.empty() && std::find(d.head_dims.begin(), d.head_dims.end(), p.head_dim) == d.head_dims.end()) {
    std::string list;
    for (int32_t h : d.head_dims) list += (list.empty() ? "" : ", ") + std::to_string(h);
    return who + "does not support head_dim " + std::to_string(p.head_dim) + " (supports " + list + ")";
  }
  return "";
}

CaseResult run_case(const suite::Case& c, const std::shared_ptr<const Plugin>& plugin, Backend& backend,
                    const RunnerOptions& options) {
  CaseResult result;
  result.spec = c;
  result.plugin_version = plugin->description().version;
  result.device = device_kind_name(backend.device_kind());
  int32_t device_type = backend.device_kind() == DeviceKind::cuda ? ATTNHOST_DEVICE_CUDA : ATTNHOST_DEVICE_CPU;
  std::unique_ptr<ProblemBinding> binding;
  std::string binding_error;
  try {
    binding = std::make_unique<ProblemBinding>(c, plugin->description(), device_type);
  } catch (const std::exception& e) {
    binding_error = e.what();
  }
  for (int ws : c.world_sizes) {
    RunResult run;
    run.world_size = ws;
    if (!binding) {
      run.status = "ERROR";
      run.error = binding_error;
    } else if (ws > backend.max_world_size()) {
      run.status = "SKIPPED";
      run.error = "world size " + std::to_string(ws) + " needs " + std::to_string(ws) + " ranks; " +
                  std::to_string(backend.max_world_size()) + " available";
    } else if (std::string why = capability_mismatch(c, plugin->description(), backend.device_kind(), ws); !why.empty()) {
      run.status = "UNSUPPORTED";
      run.error = why;
    } else if (std::string refused = plugin->validate(binding->at(0, ws)); !refused.empty()) {
      run.status = "UNSUPPORTED";
      run.error = "plugin '" + plugin->name() + "' refused the problem: " + refused;
    } else {
      run = backend.run_world(ws, [&](RankEnv& env) { return RankRun(c, *plugin, *binding, env, options).run(); });
      run.world_size = ws;
    }
    if (options.progress && backend.process_rank() == 0) {
      std::ostringstream line;
      line << c.id << " ws=" << ws << ": " << run.status;
      if (!run.error.empty()) line << " (" << run.error << ")";
      options.progress(line.str());
    }
    if (result.engine.empty()) result.engine = run.engine;
    if (options.on_run && backend.process_rank() == 0) options.on_run(run);
    result.runs.push_back(std::move(run));
  }
  // Speedup and efficiency against world size 1 of the same case and pass.
  const RunResult* single = nullptr;
  for (const RunResult& r : result.runs)
    if (r.world_size == 1 && (r.status == "PASSED" || r.status == "OK")) single = &r;
  if (single)
    for (RunResult& r : result.runs)
      for (PassResult& p : r.passes)
        if (const PassResult* base = single->pass(p.pass); base && p.time_ms.median > 0) {
          p.speedup = base->time_ms.median / p.time_ms.median;
          p.efficiency = p.speedup / r.world_size;
        }
  return result;
}

}  // namespace attnhost
