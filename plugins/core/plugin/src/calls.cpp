#include "calls.h"

#include <algorithm>
#include <limits>

namespace attncore::plugin {

int32_t output_dtype(const RingShape& s) {
  return static_cast<int32_t>(attncore::output_dtype(core_dtype(s.dtype)));  // DType's values are attnhost's
}

void output_amax(Engine& e, const RingShape& s, float* amax, const TensorRef& x, int64_t tokens, int32_t heads,
                 void* stream) {
  AmaxParams p;
  p.dtype = core_dtype(output_dtype(s));
  p.batch = s.batch;
  p.heads = heads;
  p.head_dim = s.head_dim;
  p.seqlen = tokens;
  p.x = x;
  p.amax = amax;
  e.amax(p, stream);
}

void report_amax(Engine& e, const RingShape& s, const attnhost_forward_args& a, void* stream) {
  if (attnhost_fp8_amax* amax = fp8_amax(a))
    output_amax(e, s, &amax->o, LocalViews{s}.q(a.o.data, 0, Elem::output), s.local_q, s.heads_q, stream);
}

void report_amax(Engine& e, const RingShape& s, const attnhost_backward_args& a, void* stream) {
  attnhost_fp8_amax* amax = fp8_amax(a);
  if (!amax) return;
  const LocalViews v{s};
  output_amax(e, s, &amax->dq, v.q(a.dq.data, 0, Elem::output), s.local_q, s.heads_q, stream);
  output_amax(e, s, &amax->dk, v.kv(a.dk.data, 0, Elem::output), s.local_kv, s.heads_kv, stream);
  output_amax(e, s, &amax->dv, v.kv(a.dv.data, 0, Elem::output), s.local_kv, s.heads_kv, stream);
}

size_t elem_size(const RingShape& s, Elem e) {
  return e == Elem::fp32 ? 4 : attnhost::dtype_size(e == Elem::input ? s.dtype : output_dtype(s));
}

TensorRef LocalViews::q(void* base, int64_t row0, Elem e) const {
  const int64_t token = static_cast<int64_t>(s.heads_q) * s.head_dim;
  const size_t el = elem_size(s, e);
  return {static_cast<char*>(base) + row0 * token * el, s.local_q * token, token, s.head_dim};
}

TensorRef LocalViews::kv(void* base, int64_t col0, Elem e) const {
  const int64_t token = static_cast<int64_t>(s.heads_kv) * s.head_dim;
  const size_t el = elem_size(s, e);
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

ForwardParams forward_params(const RingShape& s, const BlockCall& c, void* q, void* k, void* v,
                             const attnhost_fp8_scaling* fp8) {
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
  p.q = views.q(q, c.q_begin, Elem::input);
  p.k = views.kv(k, c.kv_begin, Elem::input);
  p.v = views.kv(v, c.kv_begin, Elem::input);
  if (fp8) {
    p.descale_q = fp8->descale_q;
    p.descale_k = fp8->descale_k;
    p.descale_v = fp8->descale_v;
  }
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
  p.q = views.q(a.q.data, c.q_begin, Elem::input);
  p.k = views.kv(k, c.kv_begin, Elem::input);
  p.v = views.kv(v, c.kv_begin, Elem::input);
  // (dO's views take the inputs' element size: the one type it may differ in, e5m2 beside e4m3, is
  // one byte too; check_supported_do allows no other. So do the ring's packed slices and buffers.)
  p.d_o = views.q(a.d_o.data, c.q_begin, Elem::input);
  if (d_o_dtype(s, a) != s.dtype) p.dtype_do = core_dtype(d_o_dtype(s, a));  // the hybrid FP8 recipe's e5m2 dO
  p.o = views.q(a.o.data, c.q_begin, Elem::output);  // the final output: the cuDNN engine recomputes delta from it
  if (const attnhost_fp8_scaling* fp8 = fp8_scaling(a)) {
    p.descale_q = fp8->descale_q;
    p.descale_k = fp8->descale_k;
    p.descale_v = fp8->descale_v;
    p.descale_do = fp8->descale_do;
  }
  p.lse = views.stats(static_cast<float*>(a.lse.data), c.q_begin);
  p.delta = views.stats(delta, c.q_begin);
  p.dq = views.q(dq, c.q_begin, Elem::fp32);
  p.dk = views.kv(dk, c.kv_begin, Elem::fp32);
  p.dv = views.kv(dv, c.kv_begin, Elem::fp32);
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
  const Elem e = s.kv_grads_fp32 ? Elem::fp32 : Elem::output;
  p.dk = views.kv(a.dk.data, c.kv_begin, e);
  p.dv = views.kv(a.dv.data, c.kv_begin, e);
  p.write_dkdv = true;
  p.write_dkdv_fp32 = s.kv_grads_fp32;
}

LocalSizes local_sizes(const RingShape& s) {
  return {static_cast<size_t>(s.batch) * s.local_q * s.heads_q * s.head_dim,
          static_cast<size_t>(s.batch) * s.local_kv * s.heads_kv * s.head_dim,
          static_cast<size_t>(s.batch) * s.heads_q * s.local_q};
}

RowBuffers take_row_buffers(Carver& c, Pass pass, const RingShape& s) {
  const LocalSizes n = local_sizes(s);
  RowBuffers b;
  if (pass == Pass::forward) {
    b.o_acc = c.take<float>(n.q * 4);
    b.o_part = c.take<float>(n.q * 4);
    b.lse_part = c.take<float>(n.rows * 4);
  } else {
    b.delta = c.take<float>(n.rows * 4);
    b.dq = c.take<float>(n.q * 4);
  }
  return b;
}

void compute_local_delta(const RingShape& s, Engine& engine, const attnhost_backward_args& a, float* delta, float* dq,
                         void* stream) {
  compute_local_delta(s, engine, a, delta, dq, {0, s.local_q}, true, stream);
}

void compute_local_delta(const RingShape& s, Engine& engine, const attnhost_backward_args& a, float* delta, float* dq,
                         Interval rows, bool clear, void* stream) {
  const LocalViews views{s};
  DeltaParams dp;
  dp.dtype = core_dtype(d_o_dtype(s, a));  // dO's (O's is output_dtype of it: FP8 calls write bf16)
  dp.batch = s.batch;
  dp.heads = s.heads_q;
  dp.head_dim = s.head_dim;
  dp.seqlen = rows.size();
  dp.o = views.q(a.o.data, rows.lo, Elem::output);
  dp.d_o = views.q(a.d_o.data, rows.lo, Elem::input);
  if (const attnhost_fp8_scaling* fp8 = fp8_scaling(a)) dp.descale_do = fp8->descale_do;
  dp.delta = views.stats(delta, rows.lo);
  if (clear) {
    dp.zero = dq;
    dp.zero_bytes = local_sizes(s).q * 4;
  }
  engine.compute_delta(dp, stream);
}

namespace {

ConvertParams out_params(const RingShape& s, const float* src, void* dst, bool kv, Interval rows) {
  const LocalViews views{s};
  ConvertParams cv;
  cv.dtype = core_dtype(output_dtype(s));
  cv.batch = s.batch;
  cv.heads = kv ? s.heads_kv : s.heads_q;
  cv.head_dim = s.head_dim;
  cv.seqlen = rows.size();
  float* from = const_cast<float*>(src);
  cv.src = kv ? views.kv(from, rows.lo, Elem::fp32) : views.q(from, rows.lo, Elem::fp32);
  cv.dst = kv ? views.kv(dst, rows.lo, Elem::output) : views.q(dst, rows.lo, Elem::output);
  return cv;
}

}  // namespace

void convert_out(const RingShape& s, Engine& engine, const float* src, void* dst, bool kv, void* stream,
                 const float* add) {
  ConvertParams cv = out_params(s, src, dst, kv, {0, kv ? s.local_kv : s.local_q});
  if (add) cv.add = out_params(s, add, dst, kv, {0, kv ? s.local_kv : s.local_q}).src;
  engine.convert(cv, stream);
}

void convert_rows_out(const RingShape& s, Engine& engine, const float* src, const TensorRef& dst, Interval rows,
                      void* stream) {
  if (rows.size() == 0) return;
  ConvertParams cv = out_params(s, src, dst.data, false, rows);
  cv.dst = dst;
  engine.convert(cv, stream);
}

bool dense(const BlockCall& c) { return !c.segments && c.num_segments == 0 && !c.blocks && !c.backward_segments; }

std::vector<std::vector<OutputCall>> output_calls(const std::vector<std::vector<BlockCall>>& steps) {
  std::vector<std::vector<OutputCall>> out(steps.size());
  for (size_t step = 0; step < steps.size(); ++step)
    for (size_t i = 0; i < steps[step].size(); ++i) {
      const BlockCall& c = steps[step][i];
      // The rows of c that other calls reach, merged.
      std::vector<std::pair<int64_t, int64_t>> others;
      for (size_t t = 0; t < steps.size(); ++t)
        for (size_t j = 0; j < steps[t].size(); ++j) {
          const BlockCall& o = steps[t][j];
          const int64_t b = std::max(o.q_begin, c.q_begin), e = std::min(o.q_end, c.q_end);
          if ((t != step || j != i) && e > b) others.emplace_back(b, e);
        }
      if (!dense(c) || others.empty()) {
        out[step].push_back({c, others.empty()});
        continue;
      }
      std::sort(others.begin(), others.end());
      const auto piece = [&](int64_t b, int64_t e, bool direct) {
        if (e <= b) return;
        BlockCall p = c;
        p.q_begin = b;
        p.q_end = e;
        p.q_pos0 = c.q_pos0 + (b - c.q_begin);
        out[step].push_back({p, direct});
      };
      int64_t at = c.q_begin;
      for (size_t k = 0; k < others.size();) {
        int64_t b = others[k].first, e = others[k].second;
        for (++k; k < others.size() && others[k].first <= e; ++k) e = std::max(e, others[k].second);
        piece(at, b, true);
        piece(std::max(at, b), e, false);
        at = std::max(at, e);
      }
      piece(at, c.q_end, true);
    }
  // A call is the last on its rows where no call after it, in this order, reaches any of them.
  for (size_t step = 0; step < out.size(); ++step)
    for (size_t i = 0; i < out[step].size(); ++i) {
      const BlockCall& c = out[step][i].call;
      bool later = false;
      for (size_t t = step; t < out.size() && !later; ++t)
        for (size_t j = t == step ? i + 1 : 0; j < out[t].size() && !later; ++j)
          later = std::min(out[t][j].call.q_end, c.q_end) > std::max(out[t][j].call.q_begin, c.q_begin);
      out[step][i].last = !later;
    }
  return out;
}

bool OutputAccumulator::written(int64_t begin, int64_t end) const {
  int64_t covered = 0;
  for (auto [b, e] : rows_) covered += std::max<int64_t>(0, std::min(e, end) - std::max(b, begin));
  for (auto [b, e] : direct_)
    if (std::min(e, end) > std::max(b, begin)) covered = -1;
  if (covered == 0) return false;
  if (covered == end - begin) return true;
  attnhost::fail(ATTNHOST_ERR_INTERNAL, "schedule: a call covers rows that are partly merged already");
}

void OutputAccumulator::run(ForwardParams p, const OutputCall& oc, void* stream) {
  const LocalViews views{s_};
  const BlockCall& c = oc.call;
  const bool first = !written(c.q_begin, c.q_end);
  if (oc.direct && !first) attnhost::fail(ATTNHOST_ERR_INTERNAL, "schedule: a direct call on rows written already");
  // The last merge on its rows writes them rounded into the output: no conversion pass over them
  // (half as many bytes again as a merge pass) follows.
  const bool rounds_out = !first && oc.last && output_dtype(s_) != ATTNHOST_DTYPE_FP32;
  if (rounds_out) rounded_.emplace_back(c.q_begin, c.q_end);
  p.o = oc.direct ? views.q(o_, c.q_begin, Elem::output) : views.q(first ? o_acc_ : o_part_, c.q_begin, Elem::fp32);
  p.o_fp32 = !oc.direct;
  p.lse = views.stats(first ? lse_ : lse_part_, c.q_begin);
  if (!first && dense(c) && engine_.merges_prior(p)) {
    // The kernel merges the rows' partial in as it writes them, the last merge straight into the
    // output in its dtype: no partial in fp32 goes out and back, and no merge pass follows.
    p.o_prior = views.q(o_acc_, c.q_begin, Elem::fp32);
    p.lse_prior = p.lse = views.stats(lse_, c.q_begin);
    p.o = rounds_out ? views.q(o_, c.q_begin, Elem::output) : p.o_prior;
    p.o_fp32 = !rounds_out;
    engine_.forward(p, stream);
    return;
  }
  engine_.forward(p, stream);
  if (first) {
    (oc.direct ? direct_ : rows_).emplace_back(c.q_begin, c.q_end);
    return;
  }
  MergeParams m;
  m.batch = s_.batch;
  m.heads = s_.heads_q;
  m.head_dim = s_.head_dim;
  m.seqlen = p.seqlen_q;
  m.o_acc = views.q(o_acc_, c.q_begin, Elem::fp32);
  m.lse_acc = views.stats(lse_, c.q_begin);
  m.o_part = p.o;
  m.lse_part = p.lse;
  if (rounds_out) {
    m.o_out = views.q(o_, c.q_begin, Elem::output);
    m.out_dtype = core_dtype(output_dtype(s_));
  }
  engine_.merge(m, stream);
}

namespace {

// Row ranges sorted and merged.
std::vector<std::pair<int64_t, int64_t>> merged(std::vector<std::pair<int64_t, int64_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (auto [b, e] : ranges)
    if (!out.empty() && b <= out.back().second) out.back().second = std::max(out.back().second, e);
    else out.emplace_back(b, e);
  return out;
}

// Sorted, disjoint row ranges `from` less sorted, disjoint `cut`.
std::vector<std::pair<int64_t, int64_t>> without(const std::vector<std::pair<int64_t, int64_t>>& from,
                                                 const std::vector<std::pair<int64_t, int64_t>>& cut) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (auto [b, e] : from) {
    for (auto [cb, ce] : cut) {
      if (ce <= b || cb >= e) continue;
      if (cb > b) out.emplace_back(b, cb);
      b = std::max(b, ce);
    }
    if (e > b) out.emplace_back(b, e);
  }
  return out;
}

}  // namespace

void OutputAccumulator::finish(void* stream) {
  const LocalViews views{s_};
  std::vector<std::pair<int64_t, int64_t>> all = rows_, gaps;
  all.insert(all.end(), direct_.begin(), direct_.end());
  int64_t at = 0;
  for (auto [b, e] : merged(all)) {
    if (b > at) gaps.emplace_back(at, b);
    at = std::max(at, e);
  }
  if (at < s_.local_q) gaps.emplace_back(at, s_.local_q);
  const size_t el = elem_size(s_, Elem::output);  // zero is all-zero bits in every dtype
  for (auto [begin, end] : gaps)
    for (int32_t b = 0; b < s_.batch; ++b) {
      TensorRef o = views.q(o_, begin, Elem::output);
      engine_.zero(static_cast<char*>(o.data) + b * o.batch_stride * el, (end - begin) * o.token_stride * el, stream);
      for (int32_t h = 0; h < s_.heads_q; ++h)
        engine_.fill(lse_ + (static_cast<int64_t>(b) * s_.heads_q + h) * s_.local_q + begin,
                     -std::numeric_limits<float>::infinity(), end - begin, stream);
    }
  const std::vector<std::pair<int64_t, int64_t>> fp32 = without(merged(rows_), merged(rounded_));
  if (fp32.size() == 1 && fp32[0] == std::pair<int64_t, int64_t>{0, s_.local_q})
    return convert_out(s_, engine_, o_acc_, o_, false, stream);
  for (auto [begin, end] : fp32) {
    ConvertParams cv;
    cv.dtype = core_dtype(output_dtype(s_));
    cv.batch = s_.batch;
    cv.heads = s_.heads_q;
    cv.head_dim = s_.head_dim;
    cv.seqlen = end - begin;
    cv.src = views.q(o_acc_, begin, Elem::fp32);
    cv.dst = views.q(o_, begin, Elem::output);
    engine_.convert(cv, stream);
  }
}

}  // namespace attncore::plugin
