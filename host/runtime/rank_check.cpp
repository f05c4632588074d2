#include "runtime/rank_state.h"

#include "runtime/check.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace attnhost {

namespace {

void run_outputs_once(RankState& state) {
  state.forward();
  if (state.gradients) state.backward();
  state.env.device.synchronize();
}

int64_t count_nonfinite(RankState& state, void* base, int32_t dtype, const Instance::Layout& l, int32_t heads, bool lse_layout) {
  int64_t bad = 0;
  const int64_t D = state.problem.head_dim;
  for (int64_t b = 0; b < state.problem.batch; ++b)
    for (const attnhost_token_range& r : l.ranges) {
      if (lse_layout) {
        for (int32_t h = 0; h < heads; ++h) {
          size_t off = (static_cast<size_t>(b) * heads + h) * l.local_tokens + r.local_begin;
          bad += state.env.device.count_nonfinite(static_cast<float*>(base) + off, dtype, r.length, true);
        }
      } else {
        size_t off = (static_cast<size_t>(b) * l.local_tokens + r.local_begin) * heads * D;
        bad += state.env.device.count_nonfinite(static_cast<char*>(base) + off * dtype_bytes(dtype), dtype,
                                           r.length * heads * D, false);
      }
    }
  return bad;
}

// The largest |x| over the rows this rank owns of a fetched output (what a plugin reports as amax).
double owned_amax(const RankState& state, const std::vector<char>& buf, int32_t dtype, const Instance::Layout& l,
                  int32_t heads) {
  const size_t row = static_cast<size_t>(heads) * state.problem.head_dim;
  double most = 0;
  for (int64_t b = 0; b < state.problem.batch; ++b)
    for (const attnhost_token_range& r : l.ranges) {
      const size_t first = (static_cast<size_t>(b) * l.local_tokens + r.local_begin) * row;
      for (size_t i = first; i < first + static_cast<size_t>(r.length) * row; ++i)
        most = std::max(most, std::abs(load_element(buf.data(), dtype, i)));
    }
  return most;
}

// An FP8 problem's amax as the plugin reported it, against the outputs: every rank compares its
// own (a collective: every rank calls it); rank 0 gets the line (the largest over ranks) and what
// was wrong.
struct AmaxCheck {
  std::string line, wrong;
};
AmaxCheck check_amax(RankState& state, const RankOutputs& out) {
  attnhost_fp8_amax got{};
  state.env.device.copy_to_host(&got, state.amax, sizeof got);
  struct Field {
    const char* name;
    float reported;
    const std::vector<char>& data;
    const Instance::Layout& layout;
    int32_t heads;
  };
  std::vector<Field> fields = {{"O", got.o, out.o, state.lq, state.problem.heads_q}};
  if (state.gradients) {
    fields.push_back({"dQ", got.dq, out.dq, state.lq, state.problem.heads_q});
    fields.push_back({"dK", got.dk, out.dk, state.lkv, state.problem.heads_kv});
    fields.push_back({"dV", got.dv, out.dv, state.lkv, state.problem.heads_kv});
  }
  std::vector<double> actual, missing, wrong;
  for (const Field& f : fields) {
    const double x = owned_amax(state, f.data, out.dtype, f.layout, f.heads);
    actual.push_back(x);
    missing.push_back(std::isnan(f.reported) ? 1 : 0);
    wrong.push_back(!std::isnan(f.reported) && static_cast<double>(f.reported) != x ? 1 : 0);
  }
  actual = state.env.group.max(actual);
  missing = state.env.group.sum(missing);
  wrong = state.env.group.sum(wrong);
  // The line: each output's amax (the largest over ranks), then how the plugin's compared: one
  // word for all when they agree, else after each output that differs.
  const int n = state.env.world_size;
  const auto of_ranks = [n](double k) { return std::to_string(static_cast<int>(k)) + " of " + std::to_string(n) + " ranks"; };
  double all_missing = 0, any_missing = 0, any_wrong = 0;
  for (size_t i = 0; i < fields.size(); ++i) {
    all_missing += missing[i] == n;
    any_missing += missing[i] > 0;
    any_wrong += wrong[i] > 0;
  }
  const bool uniform = any_wrong == 0 && (any_missing == 0 || all_missing == static_cast<double>(fields.size()));
  std::ostringstream line, bad;
  for (size_t i = 0; i < fields.size(); ++i) {
    line << (i ? ", " : "") << fields[i].name << " " << actual[i];
    if (!uniform && wrong[i] > 0) line << " (wrong on " << of_ranks(wrong[i]) << ")";
    else if (!uniform && missing[i] > 0) line << " (not given on " << of_ranks(missing[i]) << ")";
    if (wrong[i] > 0) bad << (bad.tellp() > 0 ? "; " : "") << "amax of " << fields[i].name << " wrong on " << of_ranks(wrong[i]);
  }
  const std::string how = !uniform ? "" : any_missing > 0 ? " (not reported by the plugin)" : " (reported, exact)";
  return {"amax " + line.str() + how, bad.str()};
}

}  // namespace

void check_outputs(RankState& state, RunResult& result) {
  const int32_t dt = output_dtype(state.problem.dtype);
  state.env.device.poison(state.buffers.o, dt, state.buffers.nq);
  state.env.device.poison(state.buffers.lse, ATTNHOST_DTYPE_FP32, state.buffers.nlse);
  if (state.amax) state.env.device.poison(state.amax, ATTNHOST_DTYPE_FP32, 4);
  if (state.gradients) {
    state.env.device.poison(state.buffers.dq, dt, state.buffers.nq);
    state.env.device.poison(state.buffers.dk, dt, state.buffers.nkv);
    state.env.device.poison(state.buffers.dv, dt, state.buffers.nkv);
  }
  state.attempt([&] { run_outputs_once(state); });
  state.all_ok();

  std::vector<double> nonfinite = {
      static_cast<double>(count_nonfinite(state, state.buffers.o, dt, state.lq, state.problem.heads_q, false)),
      static_cast<double>(count_nonfinite(state, state.buffers.lse, ATTNHOST_DTYPE_FP32, state.lq, state.problem.heads_q, true)),
      state.gradients ? static_cast<double>(count_nonfinite(state, state.buffers.dq, dt, state.lq, state.problem.heads_q, false)) : 0.0,
      state.gradients ? static_cast<double>(count_nonfinite(state, state.buffers.dk, dt, state.lkv, state.problem.heads_kv, false)) : 0.0,
      state.gradients ? static_cast<double>(count_nonfinite(state, state.buffers.dv, dt, state.lkv, state.problem.heads_kv, false)) : 0.0};
  nonfinite = state.env.group.sum(nonfinite);

  int64_t rank_pairs = 0, total_pairs = 0;
  state.attempt([&] { state.instance->count_pairs(&rank_pairs, &total_pairs); });
  state.all_ok();
  CheckPlan plan = plan_check(state.problem, state.c.check, state.c.data.seed, total_pairs, state.gradients);

  RankOutputs out;
  out.q_layout = state.lq;
  out.kv_layout = state.lkv;
  out.dtype = dt;
  out.input_dtype = input_dtype(state.problem, data::kDO);
  out.descale_do = input_descale(state.data, out.input_dtype);
  out.batch = state.problem.batch;
  out.heads_q = state.problem.heads_q;
  out.heads_kv = state.problem.heads_kv;
  out.head_dim = state.problem.head_dim;
  const size_t el = dtype_bytes(dt);
  auto fetch = [&](std::vector<char>& dst, const void* src, size_t bytes) {
    dst.resize(bytes);
    state.env.device.copy_to_host(dst.data(), src, bytes);
  };
  fetch(out.o, state.buffers.o, state.buffers.nq * el);
  fetch(out.lse, state.buffers.lse, state.buffers.nlse * 4);
  if (state.gradients) {
    fetch(out.dq, state.buffers.dq, state.buffers.nq * el);
    fetch(out.dk, state.buffers.dk, state.buffers.nkv * el);
    fetch(out.dv, state.buffers.dv, state.buffers.nkv * el);
    fetch(out.d_o, state.buffers.d_o, state.buffers.nq * dtype_bytes(out.input_dtype));
  }
  const AmaxCheck amax = state.amax ? check_amax(state, out) : AmaxCheck{};
  std::vector<std::string> packed = state.env.group.gather(pack_samples(plan, out));
  if (state.env.rank != 0) return;
  std::vector<std::pair<std::string, int64_t>> counts = {
      {"O", static_cast<int64_t>(nonfinite[0])}, {"LSE", static_cast<int64_t>(nonfinite[1])},
      {"dQ", static_cast<int64_t>(nonfinite[2])}, {"dK", static_cast<int64_t>(nonfinite[3])},
      {"dV", static_cast<int64_t>(nonfinite[4])}};
  result.check = evaluate_check(plan, packed, state.problem, state.data, *state.instance, state.c.check, counts);
  result.check.amax = amax.line;
  if (!amax.wrong.empty()) result.check.ok = false;
  if (!result.check.ok) {
    result.status = "FAILED";
    std::ostringstream s;
    for (const TensorCheck& t : result.check.tensors) {
      if (t.ok) continue;
      s << (s.tellp() > 0 ? "; " : "") << t.tensor << ": ";
      if (t.nonfinite) s << t.nonfinite << " non-finite values";
      else s << "max error " << t.max_abs_err << " at " << t.worst << ", rel L2 " << t.rel_l2_err;
    }
    if (!amax.wrong.empty()) s << (s.tellp() > 0 ? "; " : "") << amax.wrong;
    if (!result.check.note.empty() && s.tellp() == 0) s << result.check.note;
    result.error = "check failed: " + s.str();
  }
}

}  // namespace attnhost
