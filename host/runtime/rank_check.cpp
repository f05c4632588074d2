#include "runtime/rank_state.h"

#include "runtime/check.h"

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

}  // namespace

void check_outputs(RankState& state, RunResult& result) {
  const int32_t dt = output_dtype(state.problem.dtype);
  state.env.device.poison(state.buffers.o, dt, state.buffers.nq);
  state.env.device.poison(state.buffers.lse, ATTNHOST_DTYPE_FP32, state.buffers.nlse);
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
  out.input_dtype = state.problem.dtype;
  out.descale_do = input_descale(state.data, state.problem.dtype);
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
  std::vector<std::string> packed = state.env.group.gather(pack_samples(plan, out));
  if (state.env.rank != 0) return;
  std::vector<std::pair<std::string, int64_t>> counts = {
      {"O", static_cast<int64_t>(nonfinite[0])}, {"LSE", static_cast<int64_t>(nonfinite[1])},
      {"dQ", static_cast<int64_t>(nonfinite[2])}, {"dK", static_cast<int64_t>(nonfinite[3])},
      {"dV", static_cast<int64_t>(nonfinite[4])}};
  result.check = evaluate_check(plan, packed, state.problem, state.data, *state.instance, state.c.check, counts);
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

}  // namespace attnhost
