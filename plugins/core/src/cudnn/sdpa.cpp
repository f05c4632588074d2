#include "sdpa.h"

#include <cstring>
#include <limits>

namespace attncore::cudnn {

namespace {

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

// [b, h, s, d] dims with strides from a [b, s, h, d] layout.
std::vector<int64_t> bhsd_strides(const Layout& l) { return {l.batch, l.head, l.token, 1}; }
// The transposed view [b, h, d, s] of the same memory.
std::vector<int64_t> bhds_strides(const Layout& l) { return {l.batch, l.head, 1, l.token}; }

// Row statistics [b, h, s, 1], packed: what cuDNN reads and writes for Stats before 9.26.
std::vector<int64_t> stats_dims(const SdpaShape& s) { return {s.b, s.hq, s.sq, 1}; }
std::vector<int64_t> stats_strides(const SdpaShape& s) { return {s.hq * s.sq, s.sq, 1, 1}; }

// score <- -inf where key j is hidden from row i: rows see j <= i + shift (cuDNN's right bound).
int causal_mask(GraphBuilder& g, int score, const CudnnMask& m, int neg_inf) {
  const auto dims = g.dims(score);
  int row = g.virt(dims, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, row, score, -1, -1, 2);
  if (m.shift != 0) {
    const int shifted = g.virt(dims, CUDNN_DATA_INT32);
    g.pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, shifted, row, g.scalar_i32(int32_t(m.shift)));
    row = shifted;
  }
  const int col = g.virt(dims, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, col, score, -1, -1, 3);
  const int keep = g.virt(dims, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, keep, row, col);
  const int out = g.virt(dims, kF32);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, kF32, out, score, neg_inf, keep);
  return out;
}

// score <- -inf outside [0, seq_q) x [0, seq_kv) (per-batch lengths; here the full lengths).
int padding_mask(GraphBuilder& g, int score, int seq_q, int seq_kv, int neg_inf) {
  const auto dims = g.dims(score);
  const int row = g.virt(dims, CUDNN_DATA_INT32), col = g.virt(dims, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, row, score, -1, -1, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, col, score, -1, -1, 3);
  const int row_in = g.virt(dims, CUDNN_DATA_BOOLEAN), col_in = g.virt(dims, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row_in, row, seq_q);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col_in, col, seq_kv);
  const int keep = g.virt(dims, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, keep, row_in, col_in);
  const int out = g.virt(dims, kF32);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, kF32, out, score, neg_inf, keep);
  return out;
}

float negative_infinity() { return -std::numeric_limits<float>::infinity(); }

// The softmax of the masked scores x with its statistics, as cuDNN's engines match it: stats =
// max + log(sum(exp(x - max))) in natural log, P = exp(x - max) / sum written in p_type.
int softmax_with_stats(GraphBuilder& g, const SdpaShape& s, int x, int stats, cudnnDataType_t p_type) {
  const std::vector<int64_t> sdims = g.dims(x), rdims = stats_dims(s);
  const int mx = g.virt(rdims, stats_strides(s), kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, x, mx);
  const int centered = g.virt(sdims, kF32), e = g.virt(sdims, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, kF32, centered, x, mx);
  g.pointwise(CUDNN_POINTWISE_EXP, kF32, e, centered);
  const int sum = g.virt(rdims, stats_strides(s), kF32), log_sum = g.virt(rdims, stats_strides(s), kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  g.pointwise(CUDNN_POINTWISE_LOG, kF32, log_sum, sum);
  g.pointwise(CUDNN_POINTWISE_ADD, kF32, stats, mx, log_sum);
  const int p = g.virt(sdims, p_type);
  g.pointwise(CUDNN_POINTWISE_DIV, kF32, p, e, sum);
  return p;
}

// y = x * b (b one element or broadcast), computed in fp32 and written in `type`.
int mul(GraphBuilder& g, int x, int b, cudnnDataType_t type = kF32) {
  const int y = g.virt(g.dims(x), type);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, y, x, b);
  return y;
}

// One of the FP8 graphs' one-element fp32 tensors (sdpa.h, Fp8Slot), recorded for the call to bind.
int fp8_slot(GraphBuilder& g, SdpaGraph& r, Fp8Slot slot) {
  const int t = g.tensor({1, 1, 1, 1}, {1, 1, 1, 1}, kF32, false);
  r.fp8[slot] = g.uid(t);
  return t;
}

// An FP8 product as cuDNN's engines match it: a @ b accumulated in fp32 (summed over the query
// heads of each KV head when c has fewer heads than a: GQA's dK and dV), times both descales;
// amax_c gets its largest magnitude, and c that value times scale_c, rounded to c's type.
void fp8_matmul(GraphBuilder& g, int a, int b, int c, int descale_a, int descale_b, int scale_c, int amax_c) {
  const std::vector<int64_t> ad = g.dims(a), bd = g.dims(b), cd = g.dims(c);  // copies: tensors are added below
  int acc = g.virt({ad[0], ad[1], ad[2], bd[3]}, kF32);
  g.matmul(a, b, acc);
  if (cd[1] != ad[1]) {
    const int summed = g.virt(cd, kF32);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, acc, summed);
    acc = summed;
  }
  const int real = mul(g, mul(g, acc, descale_a), descale_b);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, c, real, scale_c);
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, real, amax_c);
}

} // namespace

std::vector<int64_t> SdpaShape::key() const {
  std::vector<int64_t> k = {backward, fused_op, int64_t(io), b, hq, hkv, sq, skv, d, o_fp32, grads_fp32,
                            mask.causal, mask.shift, padding};
  for (const Layout& l : {q, this->k, v, o, d_o, dq, dk, dv}) k.insert(k.end(), {l.batch, l.token, l.head});
  int32_t bits;
  static_assert(sizeof bits == sizeof scale);
  std::memcpy(&bits, &scale, sizeof bits);
  k.push_back(bits);
  return k;
}

SdpaGraph forward_graph(const SdpaShape& s) {
  SdpaGraph r;
  GraphBuilder& g = *r.graph;
  const int q = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.q), s.io, false);
  const int v = g.tensor({s.b, s.hkv, s.skv, s.d}, bhsd_strides(s.v), s.io, false);
  const int o = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.o), s.o_fp32 ? kF32 : s.io, false);
  const int stats = g.tensor(stats_dims(s), stats_strides(s), kF32, false);
  const int scale = g.scalar(s.scale);
  int k;
  if (s.fused_op) {
    // The single fused operation takes K as it is stored, [b, h, s, d].
    k = g.tensor({s.b, s.hkv, s.skv, s.d}, bhsd_strides(s.k), s.io, false);
    Descriptor op(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, "SDPA_FWD operation");
    op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, g.tensor_desc(q));
    op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, g.tensor_desc(k));
    op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, g.tensor_desc(v));
    op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, g.tensor_desc(o));
    op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, g.tensor_desc(stats));
    op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, g.tensor_desc(scale));
    op.finalize();
    g.add_operation(std::move(op));
  } else {
    // The matmul takes K transposed: [b, h, d, s], the same memory.
    k = g.tensor({s.b, s.hkv, s.d, s.skv}, bhds_strides(s.k), s.io, false);
    const std::vector<int64_t> sdims = {s.b, s.hq, s.sq, s.skv};
    const int scores = g.virt(sdims, kF32);
    g.matmul(q, k, scores);
    int x = g.virt(sdims, kF32);
    g.pointwise(CUDNN_POINTWISE_MUL, kF32, x, scores, scale);
    if (s.mask.causal) x = causal_mask(g, x, s.mask, g.scalar(negative_infinity()));
    const int p = softmax_with_stats(g, s, x, stats, s.io);  // P in the input type: what the second matmul takes
    g.matmul(p, v, o);
  }
  r.q = g.uid(q);
  r.k = g.uid(k);
  r.v = g.uid(v);
  r.o = g.uid(o);
  r.stats = g.uid(stats);
  return r;
}

SdpaGraph backward_graph(const SdpaShape& s) {
  SdpaGraph r;
  GraphBuilder& g = *r.graph;
  const cudnnDataType_t grad_t = s.grads_fp32 ? kF32 : s.io;
  const int q = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.q), s.io, false);
  const int kt = g.tensor({s.b, s.hkv, s.d, s.skv}, bhds_strides(s.k), s.io, false);
  const int vt = g.tensor({s.b, s.hkv, s.d, s.skv}, bhds_strides(s.v), s.io, false);
  const int o = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.o), s.io, false);
  const int d_o = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.d_o), s.io, false);
  const int stats = g.tensor(stats_dims(s), stats_strides(s), kF32, false);
  const int dq = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.dq), grad_t, false);
  const int dk = g.tensor({s.b, s.hkv, s.skv, s.d}, bhsd_strides(s.dk), grad_t, false);
  const int dv = g.tensor({s.b, s.hkv, s.skv, s.d}, bhsd_strides(s.dv), grad_t, false);
  const int scale = g.scalar(s.scale), one = g.scalar(1.f);
  // Only tensors of the graph's operations may be bound: -inf exists when a mask uses it.
  const int neg_inf = s.padding || s.mask.causal ? g.scalar(negative_infinity()) : -1;
  int seq_q = -1, seq_kv = -1;
  if (s.padding) {
    seq_q = g.tensor({s.b, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32, false);
    seq_kv = g.tensor({s.b, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32, false);
  }
  const std::vector<int64_t> sdims = {s.b, s.hq, s.sq, s.skv}, rdims = stats_dims(s);
  const std::vector<int64_t> transposed = {s.hq * s.sq * s.skv, s.sq * s.skv, 1, s.skv};  // [b, h, skv, sq] view

  // delta = rowsum(dO * O), kept in the workspace ("softmax_sum")
  const int d_o_o = g.virt({s.b, s.hq, s.sq, s.d}, kF32), rowsum = g.virt(rdims, stats_strides(s), kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, d_o_o, d_o, o);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o_o, rowsum);
  const int delta = g.tensor(rdims, stats_strides(s), kF32, false);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, delta, rowsum, one);

  // P = exp(scale * Q K^T - LSE), masked
  const int scores = g.virt(sdims, kF32);
  g.matmul(q, kt, scores, seq_q, seq_kv);
  const int scaled = g.virt(sdims, kF32), centered = g.virt(sdims, kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, scaled, scores, scale);
  g.pointwise(CUDNN_POINTWISE_SUB, kF32, centered, scaled, stats);
  int x = centered;
  if (s.padding) x = padding_mask(g, x, seq_q, seq_kv, neg_inf);
  if (s.mask.causal) x = causal_mask(g, x, s.mask, neg_inf);
  const int p = g.virt(sdims, kF32);
  g.pointwise(CUDNN_POINTWISE_EXP, kF32, p, x);

  // dV = P^T dO (summed over each KV head's query heads)
  const bool gqa = s.hq != s.hkv;
  const int pt = g.virt({s.b, s.hq, s.skv, s.sq}, transposed, s.io);
  g.reshape(p, pt);
  const std::vector<int64_t> full_head = {s.b, s.hq, s.skv, s.d};
  if (!gqa) {
    g.matmul(pt, d_o, dv, seq_kv, -1, seq_q);
  } else {
    const int dv_full = g.virt(full_head, s.io);
    g.matmul(pt, d_o, dv_full, seq_kv, -1, seq_q);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);
  }

  // dS = scale * P * (dO V^T - delta)
  const int dp = g.virt(sdims, kF32);
  g.matmul(d_o, vt, dp, seq_q, seq_kv);
  const int dp_centered = g.virt(sdims, kF32), dsu = g.virt(sdims, kF32), ds = g.virt(sdims, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, kF32, dp_centered, dp, delta);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, dsu, dp_centered, p);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, ds, dsu, scale);

  // dK = dS^T Q
  const int dst = g.virt({s.b, s.hq, s.skv, s.sq}, transposed, s.io);
  g.reshape(ds, dst);
  if (!gqa) {
    g.matmul(dst, q, dk, seq_kv, -1, seq_q);
  } else {
    const int dk_full = g.virt(full_head, s.io);
    g.matmul(dst, q, dk_full, seq_kv, -1, seq_q);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);
  }

  // dQ = dS K, accumulated in fp32 in the workspace, then copied out
  const int k = g.virt({s.b, s.hkv, s.skv, s.d}, bhsd_strides(s.k), s.io);
  g.reshape(kt, k);
  const int dq_accum = g.tensor({s.b, s.hq, s.sq, s.d}, GraphBuilder::packed({s.b, s.hq, s.sq, s.d}), kF32, false);
  g.matmul(ds, k, dq_accum, seq_q, -1, seq_kv);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, kF32, dq, dq_accum);

  r.q = g.uid(q);
  r.k = g.uid(kt);
  r.v = g.uid(vt);
  r.o = g.uid(o);
  r.d_o = g.uid(d_o);
  r.stats = g.uid(stats);
  r.dq = g.uid(dq);
  r.dk = g.uid(dk);
  r.dv = g.uid(dv);
  r.softmax_sum = g.uid(delta);
  r.dq_accum = g.uid(dq_accum);
  if (s.padding) {
    r.seq_q = g.uid(seq_q);
    r.seq_kv = g.uid(seq_kv);
  }
  return r;
}

// The FP8 forward as cudnn-frontend lowers sdpa_fp8 (per-tensor scaling) for Hopper: Q K^T on
// FP8 operands in fp32, times the softmax scale and both descales (the real scores); the mask; the
// softmax with its statistics; amax of P, and P times scale_s rounded to FP8; P V as an FP8 product
// (descale_s, descale_v) whose result, times scale_o, is O in FP8, with its amax. cuDNN's Hopper
// engines write O only in FP8 (a bf16 or fp16 O needs Blackwell and 9.13: the frontend's support
// surface), so the call converts it.
SdpaGraph fp8_forward_graph(const SdpaShape& s) {
  SdpaGraph r;
  GraphBuilder& g = *r.graph;
  const int q = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.q), s.io, false);
  const int kt = g.tensor({s.b, s.hkv, s.d, s.skv}, bhds_strides(s.k), s.io, false);
  const int v = g.tensor({s.b, s.hkv, s.skv, s.d}, bhsd_strides(s.v), s.io, false);
  const int o = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.o), s.io, false);
  const int stats = g.tensor(stats_dims(s), stats_strides(s), kF32, false);
  const int descale_q = fp8_slot(g, r, kDescaleQ), descale_k = fp8_slot(g, r, kDescaleK);
  const int descale_v = fp8_slot(g, r, kDescaleV), descale_s = fp8_slot(g, r, kDescaleS);
  const int scale_s = fp8_slot(g, r, kScaleS), scale_o = fp8_slot(g, r, kScaleO);
  const int amax_s = fp8_slot(g, r, kAmaxS), amax_o = fp8_slot(g, r, kAmaxO);

  const int scores = g.virt({s.b, s.hq, s.sq, s.skv}, kF32);
  g.matmul(q, kt, scores);
  int x = mul(g, mul(g, mul(g, scores, g.scalar(s.scale)), descale_q), descale_k);
  if (s.mask.causal) x = causal_mask(g, x, s.mask, g.scalar(negative_infinity()));
  const int p = softmax_with_stats(g, s, x, stats, kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, p, amax_s);
  const int p8 = mul(g, p, scale_s, s.io);
  fp8_matmul(g, p8, v, o, descale_s, descale_v, scale_o, amax_o);

  r.q = g.uid(q);
  r.k = g.uid(kt);
  r.v = g.uid(v);
  r.o = g.uid(o);
  r.stats = g.uid(stats);
  return r;
}

// The FP8 backward as cudnn-frontend lowers sdpa_fp8_backward (per-tensor scaling) for Hopper:
// delta = rowsum(dO O) times both descales (O read in FP8); P = exp(masked real scores - stats);
// dV = P^T dO as an FP8 product of P times scale_s; dP = dO V^T times its descales; dS = P (dP -
// delta) times the softmax scale, its amax, and dS times scale_dP in FP8; dQ = dS K and dK = dS^T Q
// as FP8 products. dQ, dK, dV land in FP8 with their amax: the only form Hopper's engines write.
// No workspace tensors: unlike the bf16 graph, delta stays inside and dQ has no fp32 accumulator.
SdpaGraph fp8_backward_graph(const SdpaShape& s) {
  SdpaGraph r;
  GraphBuilder& g = *r.graph;
  const int q = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.q), s.io, false);
  const int kt = g.tensor({s.b, s.hkv, s.d, s.skv}, bhds_strides(s.k), s.io, false);
  const int vt = g.tensor({s.b, s.hkv, s.d, s.skv}, bhds_strides(s.v), s.io, false);
  const int o = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.o), s.io, false);
  const int d_o = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.d_o), s.io, false);
  const int stats = g.tensor(stats_dims(s), stats_strides(s), kF32, false);
  const int dq = g.tensor({s.b, s.hq, s.sq, s.d}, bhsd_strides(s.dq), s.io, false);
  const int dk = g.tensor({s.b, s.hkv, s.skv, s.d}, bhsd_strides(s.dk), s.io, false);
  const int dv = g.tensor({s.b, s.hkv, s.skv, s.d}, bhsd_strides(s.dv), s.io, false);
  const int descale_q = fp8_slot(g, r, kDescaleQ), descale_k = fp8_slot(g, r, kDescaleK);
  const int descale_v = fp8_slot(g, r, kDescaleV), descale_o = fp8_slot(g, r, kDescaleO);
  const int descale_do = fp8_slot(g, r, kDescaleDO), descale_s = fp8_slot(g, r, kDescaleS);
  const int descale_dp = fp8_slot(g, r, kDescaleDP), scale_s = fp8_slot(g, r, kScaleS);
  const int scale_dq = fp8_slot(g, r, kScaleDQ), scale_dk = fp8_slot(g, r, kScaleDK);
  const int scale_dv = fp8_slot(g, r, kScaleDV), scale_dp = fp8_slot(g, r, kScaleDP);
  const int amax_dq = fp8_slot(g, r, kAmaxDQ), amax_dk = fp8_slot(g, r, kAmaxDK);
  const int amax_dv = fp8_slot(g, r, kAmaxDV), amax_dp = fp8_slot(g, r, kAmaxDP);
  const int scale = g.scalar(s.scale);
  const std::vector<int64_t> sdims = {s.b, s.hq, s.sq, s.skv};
  const std::vector<int64_t> transposed = {s.hq * s.sq * s.skv, s.sq * s.skv, 1, s.skv};  // [b, h, skv, sq] view

  // delta = rowsum(dO * O) * descale_dO * descale_O
  const int d_o_o = g.virt({s.b, s.hq, s.sq, s.d}, kF32), rowsum = g.virt(stats_dims(s), stats_strides(s), kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, d_o_o, d_o, o);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o_o, rowsum);
  const int delta = mul(g, mul(g, rowsum, descale_do), descale_o);

  // P = exp(masked real scores - LSE)
  const int scores = g.virt(sdims, kF32);
  g.matmul(q, kt, scores);
  int x = mul(g, mul(g, mul(g, scores, scale), descale_q), descale_k);
  if (s.mask.causal) x = causal_mask(g, x, s.mask, g.scalar(negative_infinity()));
  const int centered = g.virt(sdims, kF32), p = g.virt(sdims, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, kF32, centered, x, stats);
  g.pointwise(CUDNN_POINTWISE_EXP, kF32, p, centered);

  // dV = P^T dO, P in FP8
  const int p8 = mul(g, p, scale_s, s.io);
  const int pt = g.virt({s.b, s.hq, s.skv, s.sq}, transposed, s.io);
  g.reshape(p8, pt);
  fp8_matmul(g, pt, d_o, dv, descale_s, descale_do, scale_dv, amax_dv);

  // dS = scale * P * (dO V^T - delta), in FP8
  const int dp_raw = g.virt(sdims, kF32);
  g.matmul(d_o, vt, dp_raw);
  const int dp = mul(g, mul(g, dp_raw, descale_do), descale_v);
  const int dp_centered = g.virt(sdims, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, kF32, dp_centered, dp, delta);
  const int ds = mul(g, mul(g, dp_centered, p), scale);
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, ds, amax_dp);
  const int ds8 = mul(g, ds, scale_dp, s.io);

  // dQ = dS K
  const int k = g.virt({s.b, s.hkv, s.skv, s.d}, bhsd_strides(s.k), s.io);
  g.reshape(kt, k);
  fp8_matmul(g, ds8, k, dq, descale_dp, descale_k, scale_dq, amax_dq);

  // dK = dS^T Q
  const int dst = g.virt({s.b, s.hq, s.skv, s.sq}, transposed, s.io);
  g.reshape(ds8, dst);
  fp8_matmul(g, dst, q, dk, descale_dp, descale_q, scale_dk, amax_dk);

  r.q = g.uid(q);
  r.k = g.uid(kt);
  r.v = g.uid(vt);
  r.o = g.uid(o);
  r.d_o = g.uid(d_o);
  r.stats = g.uid(stats);
  r.dq = g.uid(dq);
  r.dk = g.uid(dk);
  r.dv = g.uid(dv);
  return r;
}

} // namespace attncore::cudnn
