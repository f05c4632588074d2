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
    const std::vector<int64_t> sdims = {s.b, s.hq, s.sq, s.skv}, rdims = stats_dims(s);
    const int scores = g.virt(sdims, kF32);
    g.matmul(q, k, scores);
    int x = g.virt(sdims, kF32);
    g.pointwise(CUDNN_POINTWISE_MUL, kF32, x, scores, scale);
    if (s.mask.causal) x = causal_mask(g, x, s.mask, g.scalar(negative_infinity()));
    // softmax with its statistics: stats = max + log(sum(exp(x - max))), natural log
    const int mx = g.virt(rdims, stats_strides(s), kF32);
    g.reduction(CUDNN_REDUCE_TENSOR_MAX, x, mx);
    const int centered = g.virt(sdims, kF32), e = g.virt(sdims, kF32);
    g.pointwise(CUDNN_POINTWISE_SUB, kF32, centered, x, mx);
    g.pointwise(CUDNN_POINTWISE_EXP, kF32, e, centered);
    const int sum = g.virt(rdims, stats_strides(s), kF32), log_sum = g.virt(rdims, stats_strides(s), kF32);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
    g.pointwise(CUDNN_POINTWISE_LOG, kF32, log_sum, sum);
    g.pointwise(CUDNN_POINTWISE_ADD, kF32, stats, mx, log_sum);
    const int p = g.virt(sdims, s.io);  // P in the input type: what the second matmul takes
    g.pointwise(CUDNN_POINTWISE_DIV, kF32, p, e, sum);
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

} // namespace attncore::cudnn
