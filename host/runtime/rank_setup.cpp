#include "runtime/rank_state.h"

namespace attnhost {

namespace {

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

}  // namespace

void setup_rank(RankState& state) {
  state.lq = state.instance->layout(ATTNHOST_LAYOUT_Q);
  state.lkv = state.instance->layout(ATTNHOST_LAYOUT_KV);
  const bool packed = state.problem.num_seqs > 0;
  const int64_t B = state.problem.batch, D = state.problem.head_dim;
  const int32_t dt = state.problem.dtype, out_dt = output_dtype(dt);
  const int32_t do_dt = input_dtype(state.problem, data::kDO);
  const size_t el = dtype_bytes(dt), out_el = dtype_bytes(out_dt);
  const size_t nq = static_cast<size_t>(B) * state.lq.local_tokens * state.problem.heads_q * D;
  const size_t nkv = static_cast<size_t>(B) * state.lkv.local_tokens * state.problem.heads_kv * D;
  const size_t nlse = static_cast<size_t>(B) * state.problem.heads_q * state.lq.local_tokens;
  state.buffers.nq = nq;
  state.buffers.nkv = nkv;
  state.buffers.nlse = nlse;
  state.buffers.q = state.buffers.take(nq * el);
  state.buffers.k = state.buffers.take(nkv * el);
  state.buffers.v = state.buffers.take(nkv * el);
  state.buffers.o = state.buffers.take(nq * out_el);
  state.buffers.lse = state.buffers.take(nlse * 4);
  state.buffers.d_o = state.buffers.take(nq * dtype_bytes(do_dt));
  if (state.instance->has_backward()) {
    state.buffers.dq = state.buffers.take(nq * out_el);
    state.buffers.dk = state.buffers.take(nkv * out_el);
    state.buffers.dv = state.buffers.take(nkv * out_el);
  }
  auto gen = [&](void* dst, uint32_t tensor, const Instance::Layout& l, int32_t heads) {
    GenerateSpec s{state.data, tensor, input_dtype(state.problem, tensor), B, l.local_tokens, heads,
                   state.problem.head_dim, l.ranges};
    state.env.device.generate(dst, s);
  };
  gen(state.buffers.q, data::kQ, state.lq, state.problem.heads_q);
  gen(state.buffers.k, data::kK, state.lkv, state.problem.heads_kv);
  gen(state.buffers.v, data::kV, state.lkv, state.problem.heads_kv);
  gen(state.buffers.d_o, data::kDO, state.lq, state.problem.heads_q);
  // Outputs start as NaN: an element the plugin never writes cannot pass the check.
  state.env.device.poison(state.buffers.o, out_dt, nq);
  state.env.device.poison(state.buffers.lse, ATTNHOST_DTYPE_FP32, nlse);

  const int dev = state.env.device.ordinal();
  auto qshape = [&](int32_t heads, const Instance::Layout& l) {
    return packed ? std::vector<int64_t>{l.local_tokens, heads, D} : std::vector<int64_t>{B, l.local_tokens, heads, D};
  };
  std::vector<int64_t> lse_shape = packed ? std::vector<int64_t>{state.problem.heads_q, state.lq.local_tokens}
                                          : std::vector<int64_t>{B, state.problem.heads_q, state.lq.local_tokens};
  state.fwd.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_forward_args, amax);
  state.fwd.q = make_tensor(state.buffers.q, state.problem, dt, qshape(state.problem.heads_q, state.lq), dev);
  state.fwd.k = make_tensor(state.buffers.k, state.problem, dt, qshape(state.problem.heads_kv, state.lkv), dev);
  state.fwd.v = make_tensor(state.buffers.v, state.problem, dt, qshape(state.problem.heads_kv, state.lkv), dev);
  state.fwd.o = make_tensor(state.buffers.o, state.problem, out_dt, qshape(state.problem.heads_q, state.lq), dev);
  state.fwd.lse = make_tensor(state.buffers.lse, state.problem, ATTNHOST_DTYPE_FP32, lse_shape, dev);
  state.bwd.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_backward_args, amax);
  state.bwd.q = state.fwd.q; state.bwd.k = state.fwd.k; state.bwd.v = state.fwd.v; state.bwd.o = state.fwd.o; state.bwd.lse = state.fwd.lse;
  state.bwd.d_o = make_tensor(state.buffers.d_o, state.problem, do_dt, qshape(state.problem.heads_q, state.lq), dev);
  state.bwd.dq = make_tensor(state.buffers.dq, state.problem, out_dt, qshape(state.problem.heads_q, state.lq), dev);
  state.bwd.dk = make_tensor(state.buffers.dk, state.problem, out_dt, qshape(state.problem.heads_kv, state.lkv), dev);
  state.bwd.dv = make_tensor(state.buffers.dv, state.problem, out_dt, qshape(state.problem.heads_kv, state.lkv), dev);
  if (is_fp8(dt)) {  // every input generated alike, so one descale serves all of one format
    state.fp8.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_fp8_scaling, descale_do);
    const float descale = static_cast<float>(input_descale(state.data, dt));
    state.fp8.descale_q = state.fp8.descale_k = state.fp8.descale_v = descale;
    state.fp8.descale_do = static_cast<float>(input_descale(state.data, do_dt));
    state.fwd.fp8 = state.bwd.fp8 = &state.fp8;
    state.amax = static_cast<attnhost_fp8_amax*>(state.buffers.take(sizeof(attnhost_fp8_amax)));
    state.env.device.poison(state.amax, ATTNHOST_DTYPE_FP32, 4);
    state.fwd.amax = state.bwd.amax = state.amax;
  }
}

}  // namespace attnhost
