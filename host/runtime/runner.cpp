#include "runtime/runner.h"

#include "common/errors.h"
#include "runtime/problem.h"
#include "runtime/rank_state.h"
#include "runtime/services.h"

#include <algorithm>
#include <chrono>
#include <sstream>

namespace attnhost {

namespace {

// Ends a run on every rank with the same status (thrown after RankGroup::agree).
struct RunAbort {
  std::string status, message;
};

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

// One rank's run of a case: its phases in order (rank_state.h), each ended by agreement.
class RankRun {
 public:
  RankRun(const suite::Case& c, const Plugin& plugin, const ProblemBinding& binding, RankEnv& env,
          const RunnerOptions& options)
      : plugin_(plugin), options_(options), state_(c, env, binding.at(env.rank, env.world_size, env.local_rank, env.local_size)),
        tracer_(env.device, env.rank), services_(env.device, env.comm, tracer_, env.rank) {
    state_.data.seed = c.data.seed;
    state_.data.distribution = c.data.distribution == "uniform" ? data::kUniform : data::kNormal;
    state_.data.scale = static_cast<float>(c.data.scale);
  }

  RunResult run() {
    RankState& s = state_;
    RunResult result;
    result.world_size = s.env.world_size;
    auto wall0 = std::chrono::steady_clock::now();
    try {
      phase(s.env, "create", [&] { s.instance = plugin_.create(s.problem, services_.api()); }, &services_);
      phase(s.env, "setup", [&] { setup_rank(s); }, &services_);
      s.gradients = s.instance->has_backward() && wants_backward();
      for (const std::string& pass : s.c.timing.passes) {
        if (pass != "fwd" && !s.instance->has_backward()) continue;
        PassResult pr;
        phase(s.env, pass.c_str(), [&] { pr = time_pass(s, tracer_, pass); }, &services_);
        result.passes.push_back(std::move(pr));
      }
      if (options_.trace) phase(s.env, "trace", [&] { trace_iteration(s, tracer_, result); }, &services_);
      if (s.c.check.enabled) phase(s.env, "check", [&] { check_outputs(s, result); }, &services_);
      else result.status = "OK";
      phase(s.env, "summary", [&] { summarize_ranks(s, result); }, &services_);
    } catch (const RunAbort& a) {
      result.status = a.status;
      result.error = a.message;
    }
    s.instance.reset();  // the instance frees its workspace before the buffers go
    result.engine = services_.engine_note();
    result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return result;
  }

 private:
  bool wants_backward() const {
    for (const std::string& p : state_.c.timing.passes)
      if (p != "fwd") return true;
    return state_.c.check.enabled;  // the check covers gradients whenever the plugin has them
  }

  const Plugin& plugin_;
  const RunnerOptions& options_;
  RankState state_;
  Tracer tracer_;
  RankServices services_;
};

bool has_feature(const PluginDescription& d, uint32_t f) { return (d.features & f) != 0; }

// A later round's run of a world size into the pooled record: each pass's samples together and its
// figures from their median. A round that fails replaces the record, which then says what went
// wrong; the first round's check stands for all (later rounds are not checked again).
void pool(RunResult& into, RunResult&& round) {
  if (!round.ok()) {
    into = std::move(round);
    return;
  }
  for (PassResult& p : into.passes) {
    const PassResult* more = round.pass(p.pass);
    if (!more) continue;
    if (p.round_medians.empty()) p.round_medians.push_back(p.time_ms.median);
    p.round_medians.push_back(more->time_ms.median);
    std::vector<double> samples = p.time_ms.samples;
    samples.insert(samples.end(), more->time_ms.samples.begin(), more->time_ms.samples.end());
    const double before = p.time_ms.median;
    p.time_ms = summarize(std::move(samples));
    // Each rank's times and board readings, pooled alike (a round whose boards went unread drops them).
    const auto pool_ranks = [](std::vector<Stats>& all, const std::vector<Stats>& next) {
      if (next.size() != all.size()) all.clear();
      for (size_t r = 0; r < all.size(); ++r) {
        std::vector<double> own = all[r].samples;
        own.insert(own.end(), next[r].samples.begin(), next[r].samples.end());
        all[r] = summarize(std::move(own));
      }
    };
    pool_ranks(p.ranks, more->ranks);
    pool_ranks(p.sm_clock_mhz, more->sm_clock_mhz);
    pool_ranks(p.power_w, more->power_w);
    p.time_ms.stop_reason = std::to_string(p.round_medians.size()) + " rounds pooled";
    if (p.time_ms.median > 0) {
      p.tflops_per_gpu *= before / p.time_ms.median;
      p.tokens_per_s *= before / p.time_ms.median;
    }
  }
  for (size_t r = 0; r < into.peak_bytes.size() && r < round.peak_bytes.size(); ++r)
    into.peak_bytes[r] = std::max(into.peak_bytes[r], round.peak_bytes[r]);
  into.wall_seconds += round.wall_seconds;
}

}  // namespace

std::string capability_mismatch(const suite::Case& c, const PluginDescription& d, DeviceKind device, int ws) {
  const suite::Problem& p = c.problem;
  const std::string who = "plugin '" + d.name + "' ";
  uint32_t dev_bit = device == DeviceKind::cuda ? ATTNHOST_CAP_DEVICE_CUDA : ATTNHOST_CAP_DEVICE_CPU;
  if (!(d.devices & dev_bit)) return who + "does not run on " + device_kind_name(device) + " (runs on " + devices_string(d.devices) + ")";
  int32_t dt = dtype_from_name(p.dtype);
  if (!(d.dtypes & ATTNHOST_CAP_DTYPE(dt))) return who + "does not support " + p.dtype + " (supports " + dtypes_string(d.dtypes) + ")";
  if (!p.grad_dtype.empty() && !has_feature(d, ATTNHOST_FEATURE_FP8_HYBRID))
    return who + "does not take dO in " + p.grad_dtype + " beside " + p.dtype + " inputs (grad_dtype)";
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
  // Rounds after the first time the same world sizes again, unchecked; run() is one world size of one
  // round.
  suite::Case unchecked = c;
  unchecked.check.enabled = false;
  const int rounds = std::max(1, c.timing.rounds);
  // Whether a world size was timed in the first round: what every process knows alike (a check's
  // verdict is rank 0's alone), so that all of them run its later rounds, as MPI's collectives need.
  std::vector<bool> timed(c.world_sizes.size(), false);
  const auto run = [&](size_t i, int round) {
    const int ws = c.world_sizes[i];
    const suite::Case& rc = round == 0 ? c : unchecked;
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
      timed[i] = true;
      run = backend.run_world(ws, [&](RankEnv& env) { return RankRun(rc, *plugin, *binding, env, options).run(); });
      run.world_size = ws;
      run.shared_gpus = backend.shares_gpus(ws);
    }
    if (options.progress && backend.process_rank() == 0) {
      std::ostringstream line;
      line << c.id << " ws=" << ws;
      if (rounds > 1) line << " round " << round + 1 << "/" << rounds;
      line << ": " << run.status;
      if (!run.error.empty()) line << " (" << run.error << ")";
      options.progress(line.str());
    }
    return run;
  };
  for (int round = 0; round < rounds; ++round)
    for (size_t i = 0; i < c.world_sizes.size(); ++i) {
      if (round == 0) {
        result.runs.push_back(run(i, round));
      } else if (timed[i]) {
        RunResult later = run(i, round);
        if (result.runs[i].ok()) pool(result.runs[i], std::move(later));  // (nothing pools into a failure)
      }
      if (round + 1 < rounds) continue;  // a world size is finished with its last round
      if (result.engine.empty()) result.engine = result.runs[i].engine;
      if (options.on_run && backend.process_rank() == 0) options.on_run(result.runs[i]);
    }
  // Speedup and efficiency against world size 1 of the same case and pass.
  const RunResult* single = nullptr;
  for (const RunResult& r : result.runs)
    if (r.world_size == 1 && r.ok()) single = &r;
  if (single)
    for (RunResult& r : result.runs)
      for (PassResult& p : r.passes)
        if (const PassResult* base = single->pass(p.pass); base && p.time_ms.median > 0 && !r.shared_gpus) {
          p.speedup = base->time_ms.median / p.time_ms.median;
          p.efficiency = p.speedup / r.world_size;
        }
  return result;
}

}  // namespace attnhost
