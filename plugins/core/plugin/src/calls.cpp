#include "calls.h"

#include <algorithm>
#include <limits>

namespace attncore::plugin {

TensorRef LocalViews::q(void* base, int64_t row0, bool fp32) const {
  const int64_t token = static_cast<int64_t>(s.heads_q) * s.head_dim;
  const size_t el = fp32 ? 4 : attnhost::dtype_size(s.dtype);
  return {static_cast<char*>(base) + row0 * token * el, s.local_q * token, token, s.head_dim};
}

TensorRef LocalViews::kv(void* base, int64_t col0, bool fp32) const {
  const int64_t token = static_cast<int64_t>(s.heads_kv) * s.head_dim;
  const size_t el = fp32 ? 4 : attnhost::dtype_size(s.dtype);
  return {static_cast<char*>(base) + col0 * token * el, s.local_kv * token, token, s.head_dim};
}

RowStatsRef LocalViews::stats(float* base, int64_t row0) const {
  return {base + row0, static_cast<int64_t>(s.heads_q) * s.local_q, s.local_q};
}

Mask LocalViews::mask(const BlockCall& c) const {
  Mask m;
  if (c.masked) {
    m.causal = s.mask.causal;
    m.window_left = s.mask.window_left;
    m.window_right = s.mask.window_right;
  }
  m.q_pos0 = c.q_pos0;
  m.kv_pos0 = c.kv_pos0;
  return m;
}

ForwardParams forward_params(const RingShape& s, const BlockCall& c, void* q, void* k, void* v) {
  const LocalViews views{s};
  ForwardParams p;
  p.dtype = core_dtype(s.dtype);
  p.batch = s.batch;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.head_dim = s.head_dim;
  p.seqlen_q = c.q_end - c.q_begin;
  p.seqlen_kv = c.kv_end - c.kv_begin;
  p.softmax_scale = s.softmax_scale;
  p.q = views.q(q, c.q_begin, false);
  p.k = views.kv(k, c.kv_begin, false);
  p.v = views.kv(v, c.kv_begin, false);
  p.mask = views.mask(c);
  p.segments = c.segments;
  p.num_segments = c.num_segments;
  p.blocks = c.blocks;
  return p;
}

BackwardParams backward_params(const RingShape& s, const BlockCall& c, const attnhost_backward_args& a, void* k,
                               void* v, float* delta, float* dq, float* dk, float* dv) {
  const LocalViews views{s};
  BackwardParams p;
  p.dtype = core_dtype(s.dtype);
  p.batch = s.batch;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.head_dim = s.head_dim;
  p.seqlen_q = c.q_end - c.q_begin;
  p.seqlen_kv = c.kv_end - c.kv_begin;
  p.softmax_scale = s.softmax_scale;
  p.q = views.q(a.q.data, c.q_begin, false);
  p.k = views.kv(k, c.kv_begin, false);
  p.v = views.kv(v, c.kv_begin, false);
  p.d_o = views.q(a.d_o.data, c.q_begin, false);
  p.o = views.q(a.o.data, c.q_begin, false);  // the final output: the cuDNN engine recomputes delta from it
  p.lse = views.stats(static_cast<float*>(a.lse.data), c.q_begin);
  p.delta = views.stats(delta, c.q_begin);
  p.dq = views.q(dq, c.q_begin, true);
  p.dk = views.kv(dk, c.kv_begin, true);
  p.dv = views.kv(dv, c.kv_begin, true);
  p.mask = views.mask(c);
  p.segments = c.backward_segments ? c.backward_segments : c.segments;
  p.num_segments = c.backward_segments ? c.num_backward_segments : c.num_segments;
  p.blocks = c.blocks;
  p.deterministic = s.deterministic;
  return p;
}

bool covers_all_keys(const RingShape& s, const BlockCall& c) {
  const bool segments = c.backward_segments || c.num_segments > 0;
  return !segments && c.kv_begin == 0 && c.kv_end == s.local_kv && c.q_end > c.q_begin;
}

void write_dkdv_into(BackwardParams& p, const RingShape& s, const BlockCall& c, const attnhost_backward_args& a) {
  const LocalViews views{s};
  p.dk = views.kv(a.dk.data, c.kv_begin, false);
  p.dv = views.kv(a.dv.data, c.kv_begin, false);
  p.write_dkdv = true;
}

LocalSizes local_sizes(const RingShape& s) {
  return {static_cast<size_t>(s.batch) * s.local_q * s.heads_q * s.head_dim,
          static_cast<size_t>(s.batch) * s.local_kv * s.heads_kv * s.head_dim,
          static_cast<size_t>(s.batch) * s.heads_q * s.local_q};
}

void compute_local_delta(const RingShape& s, Engine& engine, const attnhost_backward_args& a, float* delta, float* dq,
                         void* stream) {
  const LocalViews views{s};
  DeltaParams dp;
  dp.dtype = core_dtype(s.dtype);
  dp.batch = s.batch;
  dp.heads = s.heads_q;
  dp.head_dim = s.head_dim;
  dp.seqlen = s.local_q;
  dp.o = views.q(a.o.data, 0, false);
  dp.d_o = views.q(a.d_o.data, 0, false);
  dp.delta = views.stats(delta, 0);
  dp.zero = dq;
  dp.zero_bytes = local_sizes(s).q * 4;
  engine.compute_delta(dp, stream);
}

void convert_out(const RingShape& s, Engine& engine, const float* src, void* dst, bool kv, void* stream) {
  const LocalViews views{s};
  ConvertParams cv;
  cv.dtype = core_dtype(s.dtype);
  cv.batch = s.batch;
  cv.heads = kv ? s.heads_kv : s.heads_q;
  cv.head_dim = s.head_dim;
  cv.seqlen = kv ? s.local_kv : s.local_q;
  cv.src = kv ? views.kv(const_cast<float*>(src), 0, true) : views.q(const_cast<float*>(src), 0, true);
  cv.dst = kv ? views.kv(dst, 0, false) : views.q(dst, 0, false);
  engine.convert(cv, stream);
}

bool OutputAccumulator::written(int64_t begin, int64_t end) const {
  int64_t covered = 0;
  for (auto [b, e] : rows_) covered += std::max<int64_t>(0, std::min(e, end) - std::max(b, begin));
  if (covered == 0) return false;
  if (covered == end - begin) return true;
  attnhost::fail(ATTNHOST_ERR_INTERNAL, "schedule: a call covers rows that are partly merged already");
}

void OutputAccumulator::run(ForwardParams p, const BlockCall& c, void* stream) {
  const LocalViews views{s_};
  const bool first = !written(c.q_begin, c.q_end);
  if (o_direct_ && !rows_.empty())
    attnhost::fail(ATTNHOST_ERR_INTERNAL, "schedule: a second call on an output written directly");
  p.o = o_direct_ ? views.q(o_direct_, c.q_begin, false) : views.q(first ? o_acc_ : o_part_, c.q_begin, true);
  p.o_fp32 = !o_direct_;
  p.lse = views.stats(first ? lse_ : lse_part_, c.q_begin);
  engine_.forward(p, stream);
  if (first) {
    rows_.emplace_back(c.q_begin, c.q_end);
    return;
  }
  MergeParams m;
  m.batch = s_.batch;
  m.heads = s_.heads_q;
  m.head_dim = s_.head_dim;
  m.seqlen = p.seqlen_q;
  m.o_acc = views.q(o_acc_, c.q_begin, true);
  m.lse_acc = views.stats(lse_, c.q_begin);
  m.o_part = p.o;
  m.lse_part = p.lse;
  engine_.merge(m, stream);
}

void OutputAccumulator::finish(void* o, void* stream) {
  const LocalViews views{s_};
  std::vector<std::pair<int64_t, int64_t>> sorted = rows_, gaps;
  std::sort(sorted.begin(), sorted.end());
  int64_t at = 0;
  for (auto [b, e] : sorted) {
    if (b > at) gaps.emplace_back(at, b);
    at = std::max(at, e);
  }
  if (at < s_.local_q) gaps.emplace_back(at, s_.local_q);
  const size_t el = o_direct_ ? attnhost::dtype_size(s_.dtype) : 4;  // zero is all-zero bits in every dtype
  for (auto [begin, end] : gaps)
    for (int32_t b = 0; b < s_.batch; ++b) {
      TensorRef acc = o_direct_ ? views.q(o_direct_, begin, false) : views.q(o_acc_, begin, true);
      engine_.zero(static_cast<char*>(acc.data) + b * acc.batch_stride * el, (end - begin) * acc.token_stride * el, stream);
      for (int32_t h = 0; h < s_.heads_q; ++h)
        engine_.fill(lse_ + (static_cast<int64_t>(b) * s_.heads_q + h) * s_.local_q + begin,
                     -std::numeric_limits<float>::infinity(), end - begin, stream);
    }
  if (!o_direct_) convert_out(s_, engine_, o_acc_, o, false, stream);
}

}  // namespace attncore::plugin
