#include "dilated_attention.h"
#include "lanes.h"

#include <algorithm>
#include <string>

namespace dilated {

using attncore::BackwardParams;
using attncore::plugin::Carver;
using attncore::plugin::Pass;
using attncore::DeltaParams;
using attncore::ForwardParams;
using attncore::RowStatsRef;
using attncore::Segment;
using attncore::TensorRef;

DilatedAttention::DilatedAttention(const Geometry& geometry, const Shape& shape,
                                   const attncore::plugin::ScheduleOptions& options)
    : s_(shape), host_(options.host), rank_(options.rank), overlap_(options.overlap), causal_(geometry.causal()),
      local_(geometry.chunk()), group_(shape.heads_q / shape.heads_kv), dtype_(attncore::plugin::core_dtype(shape.dtype)),
      engine_(attncore::plugin::Engine::make(options.cuda, options.cpu_fp64,
                                             {attncore::plugin::EngineChoice::native, options.host})),
      ops_(RowOps::make(options.cuda)) {
  build_tables(geometry);
  work_ = attncore::plugin::Workspace<Work>(host_, [&](Carver& c, Pass pass) { return layout(c, pass); });
}

// ---- tables: built once from the geometry, uploaded to the device ------------------------------

void DilatedAttention::build_tables(const Geometry& g) {
  const int32_t Hq = s_.heads_q, Hkv = s_.heads_kv;
  const int64_t a0 = g.begin(rank_);
  std::vector<int32_t> blob;
  auto put = [&](const std::vector<int32_t>& v) {
    const size_t at = blob.size();
    blob.insert(blob.end(), v.begin(), v.end());
    blob.resize((blob.size() + 3) / 4 * 4, -1);  // every table 16-byte aligned
    return at;
  };
  constexpr size_t kNone = ~size_t{0};
  struct At {
    size_t q_src = kNone, stat_src = kNone, kv_src = kNone, q_dst = kNone, kv_dst = kNone;
  };
  std::vector<At> at(g.patterns().size());

  for (size_t p = 0; p < g.patterns().size(); ++p) {
    PatternState st;
    st.pattern = g.patterns()[p];
    st.plan = g.plan(p, rank_);
    st.pairs = Geometry::pairs(st.plan, causal_);
    rank_pairs_ += st.pairs * s_.batch;
    std::vector<int32_t> q_dst(local_ * Hq, -1);
    st.strided = plan_views(st, a0);
    if (st.strided) {
      const int64_t r = st.pattern.r;
      std::vector<int32_t> stat_src(r > 1 ? st.partial_rows : 0, -1);
      for (const View& v : st.views)
        for (int32_t i = 0; i < v.heads; ++i) {
          const int32_t h = v.first_head + i * v.head_step;
          for (size_t k = v.segment_begin; k < v.segment_begin + v.segment_count; ++k)
            for (int64_t j = st.host_segments[k].q_begin; j < st.host_segments[k].q_end; ++j) {
              const int64_t tok = v.p0 + i * v.p0_step + j * r, row = v.partial_row + i * v.rows + j;
              q_dst[tok * Hq + h] = static_cast<int32_t>(row);
              if (r > 1) stat_src[row] = static_cast<int32_t>(h * local_ + tok);
            }
        }
      at[p].q_dst = put(q_dst);
      if (r > 1) at[p].stat_src = put(stat_src);
    } else {
      st.nq = st.plan.nq;
      st.nk = st.plan.nk;
      st.partial_rows = Hq * st.nq;
      std::vector<int32_t> q_src(Hq * st.nq, -1), stat_src(Hq * st.nq, -1), kv_src(Hq * st.nk, -1);
      std::vector<int32_t> kv_dst(local_ * Hkv * group_, -1);
      const int64_t a = g.begin(rank_), b = g.end(rank_);
      for (const Region& reg : st.plan.regions) {
        const int32_t h = reg.head, hk = h / group_;
        const int64_t q_row0 = h * st.nq + reg.q_slot - reg.tq_lo, k_row0 = h * st.nk + reg.kv_slot;
        for (int64_t t = reg.tq_lo; t < reg.tq_hi; ++t) {
          const int64_t tok = reg.rows.position(t) - a0, row = q_row0 + t;
          q_src[row] = static_cast<int32_t>(tok * Hq + h);
          stat_src[row] = static_cast<int32_t>(h * local_ + tok);
          q_dst[tok * Hq + h] = static_cast<int32_t>(row);
        }
        auto [lo, hi] = reg.rows.within(a, b);
        for (int64_t t = lo; t < std::min(hi, reg.kv_hi); ++t) {
          const int64_t tok = reg.rows.position(t) - a0, row = k_row0 + t;
          kv_src[row] = static_cast<int32_t>(tok * Hkv + hk);
          kv_dst[(tok * Hkv + hk) * group_ + (h - hk * group_)] = static_cast<int32_t>(row);
        }
        st.host_segments.push_back({static_cast<int32_t>(h * st.nq + reg.q_slot),
                                    static_cast<int32_t>(h * st.nq + reg.q_slot + reg.tq_hi - reg.tq_lo),
                                    static_cast<int32_t>(k_row0), static_cast<int32_t>(k_row0 + reg.kv_hi), reg.tq_lo,
                                    0});
      }
      at[p] = {put(q_src), put(stat_src), put(kv_src), put(q_dst), put(kv_dst)};
      // Keys of this rank's regions that other ranks hold: where each received row goes.
      for (int s = 0; s < g.world(); ++s) {
        if (s == rank_) continue;
        std::vector<int32_t> rows;
        for (const Run& run : g.runs(st.plan, s)) {
          const Region& reg = st.plan.regions[run.region];
          for (int64_t t = run.t_lo; t < run.t_hi; ++t)
            rows.push_back(static_cast<int32_t>(reg.head * st.nk + reg.kv_slot + t));
        }
        if (!rows.empty()) st.recvs.push_back({s, static_cast<int64_t>(rows.size()), nullptr, put(rows)});
      }
    }
    // Keys of other ranks' regions that this rank holds: which of its K/V rows each sent row is.
    for (int r = 0; r < g.world(); ++r) {
      if (r == rank_) continue;
      const PatternPlan theirs = g.plan(p, r);
      std::vector<int32_t> rows;
      for (const Run& run : g.runs(theirs, rank_)) {
        const Region& reg = theirs.regions[run.region];
        for (int64_t t = run.t_lo; t < run.t_hi; ++t)
          rows.push_back(static_cast<int32_t>((reg.rows.position(t) - a0) * Hkv + reg.head / group_));
      }
      if (!rows.empty()) st.sends.push_back({r, static_cast<int64_t>(rows.size()), nullptr, put(rows)});
    }
    exchanges_ = exchanges_ || !st.sends.empty() || !st.recvs.empty();
    patterns_.push_back(std::move(st));
  }
  // The dK/dV writer: the first strided pattern whose views hold every local key. schedule_ runs it
  // before every other strided pattern, so it writes the local dK/dV accumulators and the others add
  // to what it wrote (gathered ones keep their own buffers until the sums). With none, the
  // accumulators are zeroed first.
  for (size_t p = 0; p < patterns_.size() && dkdv_writer_ < 0; ++p) {
    const PatternState& st = patterns_[p];
    if (!st.strided) continue;
    std::vector<char> held(local_ * Hkv, 0);
    for (const View& v : st.views)
      for (int32_t i = 0; i < v.heads / group_; ++i) {
        const int32_t hk = v.first_head / group_ + i * v.head_step;
        for (size_t k = v.segment_begin; k < v.segment_begin + v.segment_count; ++k)
          for (int64_t j = st.host_segments[k].kv_begin; j < st.host_segments[k].kv_end; ++j)
            held[(v.p0 + i * v.p0_step + j * st.pattern.r) * Hkv + hk] = 1;
      }
    if (std::all_of(held.begin(), held.end(), [](char c) { return c != 0; })) dkdv_writer_ = static_cast<int>(p);
  }
  schedule_ = schedule();

  // One upload: the int tables, then every pattern's segments.
  size_t segments = 0;
  for (const PatternState& st : patterns_) segments += st.host_segments.size();
  const size_t table_bytes = (blob.size() * sizeof(int32_t) + 255) / 256 * 256;
  tables_ = attnhost::HostBuffer(host_, table_bytes + segments * sizeof(Segment));
  if (!tables_.get()) return;
  char* base = tables_.as<char>();
  if (!blob.empty()) engine_->upload(base, blob.data(), blob.size() * sizeof(int32_t));
  const int32_t* ints = reinterpret_cast<const int32_t*>(base);
  auto table = [&](size_t offset) { return offset == kNone ? nullptr : ints + offset; };
  Segment* seg = reinterpret_cast<Segment*>(base + table_bytes);
  for (size_t p = 0; p < patterns_.size(); ++p) {
    PatternState& st = patterns_[p];
    st.q_src = table(at[p].q_src);
    st.stat_src = table(at[p].stat_src);
    st.kv_src = table(at[p].kv_src);
    st.q_dst = table(at[p].q_dst);
    st.kv_dst = table(at[p].kv_dst);
    for (Message& m : st.sends) m.table = table(m.table_at);
    for (Message& m : st.recvs) m.table = table(m.table_at);
    if (st.host_segments.empty()) continue;
    engine_->upload(seg, st.host_segments.data(), st.host_segments.size() * sizeof(Segment));
    st.segments = seg;
    seg += st.host_segments.size();
  }
}

// A query head's rows in a segment are the local tokens p0 + j*r. Segments whose rows lie on one
// lattice (all of a head's, when w % r == 0) form a class: the rank's tensors seen with a token
// stride of r rows from its first row are dense tensors of the class's rows, and each segment is a
// range of j. Heads whose classes have the same segments and whose p0 grow by a fixed step share
// a call (one head stride covers both steps). Keys must all be local, and a call's query heads
// must map onto its kv heads by one stride (MHA, or r = 1: one call over every head).
bool DilatedAttention::plan_views(PatternState& st, int64_t a0) const {
  const int64_t r = st.pattern.r;
  const int32_t Hq = s_.heads_q;
  if (st.plan.remote || st.plan.regions.empty() || (r != 1 && group_ != 1)) return false;
  struct Class {
    int64_t p0 = 0;  // the local token of j = 0: the class's first row
    std::vector<Segment> segments;
    bool taken = false;
  };
  std::vector<std::vector<Class>> heads(Hq);
  for (const Region& reg : st.plan.regions) {
    const int64_t first = reg.rows.position(0) - a0;  // >= 0: the plan is not remote
    std::vector<Class>& classes = heads[reg.head];
    auto c = std::find_if(classes.begin(), classes.end(), [&](const Class& k) { return (first - k.p0) % r == 0; });
    if (c == classes.end()) c = classes.insert(classes.end(), Class{first, {}, false});
    const int64_t j0 = (first - c->p0) / r;  // regions come in position order: first >= p0
    c->segments.push_back({static_cast<int32_t>(j0 + reg.tq_lo), static_cast<int32_t>(j0 + reg.tq_hi),
                           static_cast<int32_t>(j0), static_cast<int32_t>(j0 + reg.kv_hi), reg.tq_lo, 0});
  }
  const auto same = [](const Segment& u, const Segment& v) {
    return u.q_begin == v.q_begin && u.q_end == v.q_end && u.kv_begin == v.kv_begin && u.kv_end == v.kv_end &&
           u.q_pos0 == v.q_pos0 && u.kv_pos0 == v.kv_pos0;
  };
  // Head x's untaken class with c's segments and first row p0, if any.
  const auto find = [&](int32_t x, const Class& c, int64_t p0) -> Class* {
    for (Class& k : heads[x])
      if (!k.taken && k.p0 == p0 &&
          std::equal(k.segments.begin(), k.segments.end(), c.segments.begin(), c.segments.end(), same))
        return &k;
    return nullptr;
  };
  // Heads h + i*step whose first rows are p0 + i*p0_step (the paper's offsets: heads h, h + 1, ...
  // up to the next multiple of r, or h, h + r, ...; torchscale's: contiguous groups). Each class
  // starts the longest run it can.
  for (int32_t h = 0; h < Hq; ++h)
    for (Class& c : heads[h]) {
      if (c.taken) continue;
      c.taken = true;
      const auto run = [&](int32_t step, int64_t p0_step, bool take) {
        int32_t n = 1;
        for (int32_t x = h + step; x < Hq; x += step, ++n) {
          Class* k = find(x, c, c.p0 + n * p0_step);
          if (!k) break;
          if (take) k->taken = true;
        }
        return n;
      };
      View v;
      v.first_head = h;
      v.heads = 1;
      v.p0 = c.p0;
      for (int32_t x = h + 1; x < Hq; ++x)
        for (const Class& k : heads[x]) {
          if (k.taken || k.p0 < c.p0) continue;  // strides are not negative
          const int32_t n = run(x - h, k.p0 - c.p0, false);
          if (n <= v.heads) continue;
          v.heads = n;
          v.head_step = x - h;
          v.p0_step = k.p0 - c.p0;
        }
      run(v.head_step, v.p0_step, true);
      v.segment_begin = st.host_segments.size();
      v.segment_count = c.segments.size();
      for (const Segment& seg : c.segments) {
        st.host_segments.push_back(seg);
        v.rows = std::max<int64_t>(v.rows, std::max(seg.q_end, seg.kv_end));
      }
      v.partial_row = st.partial_rows;
      st.partial_rows += v.heads * v.rows;
      st.views.push_back(v);
    }
  // A view is one launch, and a launch of less than a few waves of CTAs is as slow as its longest
  // CTA. On an H200 at S = 32768, views of one offset each: the r = 12 pattern (twelve views of 88
  // query tiles) took 2.9x the time of its one gathered call (forward), r = 6 (twelve of 176)
  // 1.9x, while r = 2 and 4 (views of 3072 and 768 tiles) ran 16-25% faster strided. So on a GPU
  // a pattern runs strided only when its views average kMinViewTiles query tiles of 128 rows,
  // unless the patterns share the GPU (lanes(), whenever overlap is on), where the other
  // lanes' CTAs fill a launch's last wave: there every pattern that can runs strided (S = 32768
  // and 131072 causal 3-4% faster at world size 1, 3% at 2, docs/KERNELS.md, "Lanes").
  // (The CPU has no waves.)
  constexpr int64_t kMinViewTiles = 512;
  int64_t tiles = 0;
  for (const View& v : st.views)
    for (size_t k = v.segment_begin; k < v.segment_begin + v.segment_count; ++k)
      tiles += int64_t{v.heads} * s_.batch * ((st.host_segments[k].q_end - st.host_segments[k].q_begin + 127) / 128);
  const bool too_small = engine_->on_device() && !overlap_ && tiles < kMinViewTiles * static_cast<int64_t>(st.views.size());
  // GQA (r = 1): the one call must hold every head, so that query head i reads kv head i / group.
  const bool gqa_split =
      group_ != 1 && (st.views.size() != 1 || st.views[0].heads != Hq || st.views[0].head_step != 1 ||
                      st.views[0].p0_step != 0);
  if (too_small || gqa_split) {
    st.views.clear();
    st.host_segments.clear();
    st.partial_rows = 0;
    return false;
  }
  return true;
}

// ---- buffers of one pass ----------------------------------------------------------------------

DilatedAttention::Work DilatedAttention::layout(Carver& c, Pass pass) const {
  const bool backward = pass == Pass::backward;
  const size_t B = s_.batch, Hq = s_.heads_q, Hkv = s_.heads_kv, D = s_.head_dim, L = local_, e = el();
  const bool ts = backward && s_.torchscale_backward;
  Work w;
  if (backward) {
    w.delta = c.take<float>(B * Hq * L * 4);
    w.dq = c.take<float>(B * L * Hq * D * 4);
    w.dk = c.take<float>(B * L * Hkv * D * 4);
    w.dv = c.take<float>(B * L * Hkv * D * 4);
  }
  for (const PatternState& st : patterns_) {
    PatternBuffers b;
    const size_t rq = B * st.partial_rows, rk = B * Hq * st.nk;
    if (st.strided) {
      if (!backward || ts) b.o = c.take<float>(rq * D * 4);  // the partial output (torchscale backward: recomputed)
      if (!backward) b.lse = c.take<float>(rq * 4);
      if (ts) b.part_lse = c.take<float>(rq * 4);
      if (backward && st.pattern.r > 1) b.lse = c.take<float>(rq * 4);  // the final LSE of the view's rows
      if (backward && (ts || st.pattern.r > 1)) b.delta = c.take<float>(rq * 4);
    } else {
      b.q = c.take<void>(rq * D * e);
      b.k = c.take<void>(rk * D * e);
      b.v = c.take<void>(rk * D * e);
      b.lse = c.take<float>(rq * 4);
      if (!backward || ts) b.o = c.take<float>(rq * D * 4);
      if (backward) {
        b.d_o = c.take<void>(rq * D * e);
        b.delta = c.take<float>(rq * 4);
        b.dq = c.take<float>(rq * D * 4);
        b.dk = c.take<float>(rk * D * 4);
        b.dv = c.take<float>(rk * D * 4);
        if (ts) b.part_lse = c.take<float>(rq * 4);
      }
    }
    for (const Message& m : st.sends) {
      b.send.push_back(c.take<char>(2 * B * m.rows * D * e));
      if (backward) b.grad_recv.push_back(c.take<char>(2 * B * m.rows * D * 4));
    }
    for (const Message& m : st.recvs) {
      b.recv.push_back(c.take<char>(2 * B * m.rows * D * e));
      if (backward) b.grad_send.push_back(c.take<char>(2 * B * m.rows * D * 4));
    }
    w.patterns.push_back(std::move(b));
  }
  return w;
}

// ---- views ------------------------------------------------------------------------------------

TensorRef DilatedAttention::local_ref(const void* base, int32_t heads) const {
  const int64_t token = int64_t{heads} * s_.head_dim;
  return {const_cast<void*>(base), local_ * token, token, s_.head_dim};
}
TensorRef DilatedAttention::rows_ref(const void* base, int64_t n) const {
  return {const_cast<void*>(base), int64_t{s_.heads_q} * n * s_.head_dim, s_.head_dim, n * s_.head_dim};
}
RowStatsRef DilatedAttention::local_stats(const float* base) const {
  return {const_cast<float*>(base), int64_t{s_.heads_q} * local_, local_};
}
RowStatsRef DilatedAttention::rows_stats(const float* base, int64_t n) const {
  return {const_cast<float*>(base), int64_t{s_.heads_q} * n, 0};
}

TensorRef DilatedAttention::view_ref(const void* base, int32_t heads, size_t bytes, const View& v, int32_t first,
                                     int64_t r) const {
  const int64_t token = int64_t{heads} * s_.head_dim;
  const char* at = static_cast<const char*>(base) + (v.p0 * token + int64_t{first} * s_.head_dim) * int64_t(bytes);
  return {const_cast<char*>(at), local_ * token, r * token, v.head_step * s_.head_dim + v.p0_step * token};
}
TensorRef DilatedAttention::partial_ref(float* base, int64_t rows, const View& v) const {
  const int64_t D = s_.head_dim;
  return {base + v.partial_row * D, rows * D, D, v.rows * D};
}
RowStatsRef DilatedAttention::partial_stats(const float* base, int64_t rows, const View& v) const {
  return {const_cast<float*>(base) + v.partial_row, rows, v.rows};
}
RowStatsRef DilatedAttention::local_stats(const float* base, const View& v) const {
  return {const_cast<float*>(base) + v.first_head * local_ + v.p0, int64_t{s_.heads_q} * local_,
          v.head_step * local_ + v.p0_step};
}

ForwardParams DilatedAttention::forward_base() const {
  ForwardParams f;
  f.dtype = dtype_;
  f.batch = s_.batch;
  f.head_dim = s_.head_dim;
  f.softmax_scale = s_.softmax_scale;
  f.o_fp32 = true;
  f.mask.causal = causal_;
  return f;
}

void DilatedAttention::view_forward(const PatternState& st, const View& v, const void* q, const void* k,
                                    const void* vv, float* o, float* lse, void* stream) {
  const int64_t r = st.pattern.r;
  ForwardParams f = forward_base();
  f.segments = st.segments + v.segment_begin;
  f.num_segments = static_cast<int32_t>(v.segment_count);
  f.heads_q = v.heads;
  f.heads_kv = v.heads / group_;
  f.seqlen_q = f.seqlen_kv = v.rows;
  f.q = view_ref(q, s_.heads_q, el(), v, v.first_head, r);
  f.k = view_ref(k, s_.heads_kv, el(), v, v.first_head / group_, r);
  f.v = view_ref(vv, s_.heads_kv, el(), v, v.first_head / group_, r);
  f.o = partial_ref(o, st.partial_rows, v);
  f.lse = partial_stats(lse, st.partial_rows, v);
  engine_->forward(f, stream);
}

ForwardParams DilatedAttention::gathered_params(const PatternState& st, const void* q, const void* k, const void* v,
                                                float* o, float* lse) const {
  ForwardParams f = forward_base();
  f.segments = st.segments;
  f.num_segments = static_cast<int32_t>(st.host_segments.size());
  f.heads_q = f.heads_kv = 1;
  f.seqlen_q = s_.heads_q * st.nq;
  f.seqlen_kv = s_.heads_q * st.nk;
  f.q = rows_ref(q, st.nq);
  f.k = rows_ref(k, st.nk);
  f.v = rows_ref(v, st.nk);
  f.o = rows_ref(o, st.nq);
  f.lse = rows_stats(lse, st.nq);
  return f;
}

// ---- the exchange of dilated K/V rows and of their gradients -----------------------------------

void DilatedAttention::exchange_kv(const void* k, const void* v, const Work& w, void* stream) {
  const int64_t row = int64_t{s_.head_dim} * el(), B = s_.batch;
  const int32_t range = host_.range_begin("dilated K/V rows exchange", ATTNHOST_RANGE_COMMUNICATION, stream);
  for (size_t p = 0; p < patterns_.size(); ++p)
    for (size_t i = 0; i < patterns_[p].sends.size(); ++i) {
      const Message& m = patterns_[p].sends[i];
      char* out = w.patterns[p].send[i];
      const int64_t src_batch = local_ * s_.heads_kv * row;
      ops_->copy({{out, k, nullptr, m.table, m.rows, static_cast<int32_t>(row), m.rows * row, src_batch},
                  {out + B * m.rows * row, v, nullptr, m.table, m.rows, static_cast<int32_t>(row), m.rows * row, src_batch}},
                 s_.batch, stream);
    }
  host_.group_start();
  for (size_t p = 0; p < patterns_.size(); ++p) {
    const PatternState& st = patterns_[p];
    for (size_t i = 0; i < st.sends.size(); ++i)
      host_.send(w.patterns[p].send[i], 2 * B * st.sends[i].rows * s_.head_dim, s_.dtype, st.sends[i].peer, stream);
    for (size_t i = 0; i < st.recvs.size(); ++i)
      host_.recv(w.patterns[p].recv[i], 2 * B * st.recvs[i].rows * s_.head_dim, s_.dtype, st.recvs[i].peer, stream);
  }
  host_.group_end();
  for (size_t p = 0; p < patterns_.size(); ++p)
    for (size_t i = 0; i < patterns_[p].recvs.size(); ++i) {
      const Message& m = patterns_[p].recvs[i];
      const PatternBuffers& b = w.patterns[p];
      const int64_t dst_batch = s_.heads_q * patterns_[p].nk * row;
      ops_->copy({{b.k, b.recv[i], m.table, nullptr, m.rows, static_cast<int32_t>(row), dst_batch, m.rows * row},
                  {b.v, b.recv[i] + B * m.rows * row, m.table, nullptr, m.rows, static_cast<int32_t>(row), dst_batch,
                   m.rows * row}},
                 s_.batch, stream);
    }
  host_.range_end(range, stream);
}

void DilatedAttention::send_gradients(const Work& w, void* compute, void* comm) {
  const int64_t D = s_.head_dim, B = s_.batch, row = D * 4;
  engine_->wait(comm, compute);  // the remote patterns' gathered dK/dV are complete
  const int32_t range = host_.range_begin("dilated dK/dV rows return", ATTNHOST_RANGE_COMMUNICATION, comm);
  for (size_t p = 0; p < patterns_.size(); ++p)
    for (size_t i = 0; i < patterns_[p].recvs.size(); ++i) {
      const Message& m = patterns_[p].recvs[i];
      const PatternBuffers& b = w.patterns[p];
      char* out = w.patterns[p].grad_send[i];
      const int64_t src_batch = s_.heads_q * patterns_[p].nk * row;
      ops_->copy({{out, b.dk, nullptr, m.table, m.rows, static_cast<int32_t>(row), m.rows * row, src_batch},
                  {out + B * m.rows * row, b.dv, nullptr, m.table, m.rows, static_cast<int32_t>(row), m.rows * row,
                   src_batch}},
                 s_.batch, comm);
    }
  host_.group_start();
  for (size_t p = 0; p < patterns_.size(); ++p) {
    const PatternState& st = patterns_[p];
    for (size_t i = 0; i < st.recvs.size(); ++i)
      host_.send(w.patterns[p].grad_send[i], 2 * B * st.recvs[i].rows * D, ATTNHOST_DTYPE_FP32, st.recvs[i].peer, comm);
    for (size_t i = 0; i < st.sends.size(); ++i)
      host_.recv(w.patterns[p].grad_recv[i], 2 * B * st.sends[i].rows * D, ATTNHOST_DTYPE_FP32, st.sends[i].peer, comm);
  }
  host_.group_end();
  host_.range_end(range, comm);
}

void DilatedAttention::add_gradients(const Work& w, void* compute, void* comm) {
  const int64_t D = s_.head_dim, B = s_.batch;
  engine_->wait(compute, comm);
  // The partials of this rank's keys, added where they belong (atomically: GQA heads share a row).
  for (size_t p = 0; p < patterns_.size(); ++p)
    for (size_t i = 0; i < patterns_[p].sends.size(); ++i) {
      const Message& m = patterns_[p].sends[i];
      const float* in = reinterpret_cast<const float*>(w.patterns[p].grad_recv[i]);
      const int64_t dst_batch = local_ * s_.heads_kv * D;
      ops_->scatter_add({w.dk, in, m.table, m.rows, static_cast<int32_t>(D), dst_batch, m.rows * D}, s_.batch, compute);
      ops_->scatter_add({w.dv, in + B * m.rows * D, m.table, m.rows, static_cast<int32_t>(D), dst_batch, m.rows * D},
                        s_.batch, compute);
    }
}

// The remote patterns wait for the K/V exchange on a lane of their own and go first there, so that
// in the backward their dK/dV return early, under the local patterns (with the remote patterns
// last, nothing hid that return: S=32768 causal on two H200s, 0.53 ms exposed of 10.45; behind the
// dK/dV writer on the compute stream, the other rank waited 2.4 ms for it; docs/KERNELS.md,
// "Two GPUs: remote patterns first"). On the compute stream one local pattern runs first, under the
// exchange: the dK/dV writer if there is one, which must precede every other strided pattern, else
// the first local one; then the others.
DilatedAttention::Schedule DilatedAttention::schedule() const {
  Schedule s;
  if (dkdv_writer_ >= 0) s.first.push_back(static_cast<size_t>(dkdv_writer_));
  for (size_t p = 0; p < patterns_.size(); ++p) {
    if (patterns_[p].plan.remote) s.remote.push_back(p);
    else if (s.first.empty()) s.first.push_back(p);
    else if (static_cast<int>(p) != dkdv_writer_) s.rest.push_back(p);
  }
  // In the backward the patterns that start at once on the lanes are the first one and the gathered
  // ones (their own buffers); the strided ones add into what the dK/dV writer wrote, so they start
  // once it is done (backward()): the gathered ones are issued first.
  std::stable_partition(s.rest.begin(), s.rest.end(), [&](size_t p) { return !patterns_[p].strided; });

  // Lanes (lanes.h): the remote patterns wait for the exchange on the last lane and go first there;
  // the backward's strided patterns after the dK/dV writer wait for it (backward()).
  std::vector<LaneJob> jobs;
  for (const PatternState& st : patterns_) jobs.push_back({st.pairs, st.plan.remote, st.strided});
  LanePlan plan = plan_lanes(jobs, dkdv_writer_, static_cast<int>(lanes().size()));
  s.forward_lane = std::move(plan.forward);
  s.backward_lane = std::move(plan.backward);
  return s;
}

// The patterns run on several streams at once, so that a pattern's last wave fills with the
// others' CTAs: the compute stream and the host's auxiliary ones (which have the higher priority),
// but for the one that carries the exchanges where ranks exchange rows. In the forward every pattern
// writes only its own buffers; the backward orders what must be (backward()).
std::vector<void*> DilatedAttention::lanes() const {
  void* compute = host_.stream(0);
  if (!overlap_ || host_.stream(1) == compute) return {compute};
  if (exchanges_) return {compute, host_.stream(2)};
  return {compute, host_.stream(1), host_.stream(2)};
}

// f(p, stream) for each pattern of `list`, in its trace range ("<pass> w=.. r=.."), on lanes[lane[p]].
template <class F>
void DilatedAttention::run_patterns(const std::vector<size_t>& list, const char* pass, const std::vector<void*>& lanes,
                                    const std::vector<int>& lane, F&& f) {
  for (size_t p : list) {
    void* stream = lanes[lane[p]];
    const Pattern& pt = patterns_[p].pattern;
    const std::string name = std::string(pass) + " w=" + std::to_string(pt.w) + " r=" + std::to_string(pt.r);
    const int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMPUTE, stream);
    f(p, stream);
    host_.range_end(range, stream);
  }
}

// ---- forward ----------------------------------------------------------------------------------

void DilatedAttention::pattern_forward(size_t p, const attnhost_forward_args& a, const PatternBuffers& b,
                                       void* stream) {
  const PatternState& st = patterns_[p];
  if (st.host_segments.empty()) return;  // no query of this rank is selected
  if (st.strided) {
    for (const View& v : st.views) view_forward(st, v, a.q.data, a.k.data, a.v.data, b.o, b.lse, stream);
    return;
  }
  const int32_t row = static_cast<int32_t>(s_.head_dim * el());
  const int64_t q_batch = s_.heads_q * st.nq * int64_t{row}, k_batch = s_.heads_q * st.nk * int64_t{row};
  ops_->copy({{b.q, a.q.data, nullptr, st.q_src, s_.heads_q * st.nq, row, q_batch, local_ * s_.heads_q * int64_t{row}},
              {b.k, a.k.data, nullptr, st.kv_src, s_.heads_q * st.nk, row, k_batch, local_ * s_.heads_kv * int64_t{row}},
              {b.v, a.v.data, nullptr, st.kv_src, s_.heads_q * st.nk, row, k_batch, local_ * s_.heads_kv * int64_t{row}}},
             s_.batch, stream);
  engine_->forward(gathered_params(st, b.q, b.k, b.v, b.o, b.lse), stream);
}

void DilatedAttention::forward(const attnhost_forward_args& a) {
  void* compute = host_.stream(0);
  void* comm = overlap_ ? host_.stream(1) : compute;
  const Work& w = work_.forward();
  if (exchanges_) {
    engine_->wait(comm, compute);  // Q, K, V are ready, and the last pass is done with the buffers
    exchange_kv(a.k.data, a.v.data, w, comm);
  }
  const std::vector<void*> lanes = this->lanes();
  for (size_t i = 1; i < lanes.size(); ++i) engine_->wait(lanes[i], compute);
  const auto run = [&](const std::vector<size_t>& list) {
    run_patterns(list, "dilated", lanes, schedule_.forward_lane,
                 [&](size_t p, void* stream) { pattern_forward(p, a, w.patterns[p], stream); });
  };
  if (exchanges_) engine_->wait(lanes.back(), comm);  // the remote patterns' lane (schedule())
  run(schedule_.remote);
  run(schedule_.first);
  run(schedule_.rest);
  for (size_t i = 1; i < lanes.size(); ++i) engine_->wait(compute, lanes[i]);
  Combine c;
  c.o = a.o.data;
  c.lse = static_cast<float*>(a.lse.data);
  c.dtype = s_.dtype;
  c.tokens = local_;
  c.heads = s_.heads_q;
  c.head_dim = s_.head_dim;
  for (size_t p = 0; p < patterns_.size(); ++p) {
    const int64_t rows = patterns_[p].partial_rows;
    c.parts.push_back({w.patterns[p].o, w.patterns[p].lse, patterns_[p].q_dst, rows * s_.head_dim, rows});
  }
  const int32_t range = host_.range_begin("dilated combine", ATTNHOST_RANGE_COMPUTE, compute);
  ops_->combine(c, s_.batch, compute);
  host_.range_end(range, compute);
}

// ---- backward ---------------------------------------------------------------------------------

void DilatedAttention::compute_delta(int32_t heads, int64_t seqlen, const TensorRef& o, bool o_fp32,
                                     const TensorRef& d_o, const RowStatsRef& delta, void* stream, float* zero,
                                     size_t zero_bytes) {
  DeltaParams dp;
  dp.dtype = dtype_;
  dp.batch = s_.batch;
  dp.heads = heads;
  dp.head_dim = s_.head_dim;
  dp.seqlen = seqlen;
  dp.o = o;
  dp.o_fp32 = o_fp32;
  dp.d_o = d_o;
  dp.delta = delta;
  dp.zero = zero;
  dp.zero_bytes = zero_bytes;
  engine_->compute_delta(dp, stream);
}

// The final LSE (and, unless the torchscale backward makes its own, delta) of a pattern's partial
// rows, gathered from the local [B, heads_q, local] stats by stat_src.
std::vector<RowCopy> DilatedAttention::stats_gather(const PatternState& st, const PatternBuffers& b,
                                                    const attnhost_backward_args& a, const Work& w) const {
  const int64_t rq = st.partial_rows, local = int64_t{s_.heads_q} * local_ * 4;
  std::vector<RowCopy> jobs = {{b.lse, a.lse.data, nullptr, st.stat_src, rq, 4, rq * 4, local}};
  if (!s_.torchscale_backward) jobs.push_back({b.delta, w.delta, nullptr, st.stat_src, rq, 4, rq * 4, local});
  return jobs;
}

void DilatedAttention::pattern_backward(size_t p, const attnhost_backward_args& a, const Work& w, void* stream) {
  const PatternState& st = patterns_[p];
  const PatternBuffers& b = w.patterns[p];
  if (st.host_segments.empty()) return;
  const bool ts = s_.torchscale_backward;
  BackwardParams bp;
  bp.dtype = dtype_;
  bp.batch = s_.batch;
  bp.head_dim = s_.head_dim;
  bp.softmax_scale = s_.softmax_scale;
  bp.mask.causal = causal_;
  // Written, not added: a gathered pattern's segments share no keys, and the writer's views hold
  // them all (each (token, kv head) in one view's segments).
  bp.write_dkdv = bp.write_dkdv_fp32 = !st.strided || static_cast<int>(p) == dkdv_writer_;
  if (st.strided) {
    const int64_t r = st.pattern.r, rq = st.partial_rows;
    // The final LSE and delta of the view's rows: the local ones when r = 1, else gathered (4 bytes
    // a row) by backward() before any pattern starts.
    for (const View& v : st.views) {
      const int32_t kv_first = v.first_head / group_;
      bp.segments = st.segments + v.segment_begin;
      bp.num_segments = static_cast<int32_t>(v.segment_count);
      bp.heads_q = v.heads;
      bp.heads_kv = v.heads / group_;
      bp.seqlen_q = bp.seqlen_kv = v.rows;
      bp.q = view_ref(a.q.data, s_.heads_q, el(), v, v.first_head, r);
      bp.k = view_ref(a.k.data, s_.heads_kv, el(), v, kv_first, r);
      bp.v = view_ref(a.v.data, s_.heads_kv, el(), v, kv_first, r);
      bp.d_o = view_ref(a.d_o.data, s_.heads_q, el(), v, v.first_head, r);
      bp.lse = r > 1 ? partial_stats(b.lse, rq, v) : local_stats(static_cast<const float*>(a.lse.data), v);
      bp.delta = ts || r > 1 ? partial_stats(b.delta, rq, v) : local_stats(w.delta, v);
      if (ts) {  // delta_i = rowsum(dO * O_i) of this pattern's own output
        view_forward(st, v, a.q.data, a.k.data, a.v.data, b.o, b.part_lse, stream);
        compute_delta(v.heads, v.rows, partial_ref(b.o, rq, v), true, bp.d_o, bp.delta, stream);
      }
      bp.dq = view_ref(w.dq, s_.heads_q, 4, v, v.first_head, r);
      bp.dk = view_ref(w.dk, s_.heads_kv, 4, v, kv_first, r);
      bp.dv = view_ref(w.dv, s_.heads_kv, 4, v, kv_first, r);
      engine_->backward(bp, stream);
    }
    return;
  }
  bp.segments = st.segments;
  bp.num_segments = static_cast<int32_t>(st.host_segments.size());
  const int32_t row = static_cast<int32_t>(s_.head_dim * el());
  const int64_t rq = s_.heads_q * st.nq, rk = s_.heads_q * st.nk;
  const int64_t q_local = local_ * s_.heads_q * int64_t{row}, kv_local = local_ * s_.heads_kv * int64_t{row};
  std::vector<RowCopy> jobs = stats_gather(st, b, a, w);
  jobs.insert(jobs.begin(), {{b.q, a.q.data, nullptr, st.q_src, rq, row, rq * row, q_local},
                             {b.k, a.k.data, nullptr, st.kv_src, rk, row, rk * row, kv_local},
                             {b.v, a.v.data, nullptr, st.kv_src, rk, row, rk * row, kv_local},
                             {b.d_o, a.d_o.data, nullptr, st.q_src, rq, row, rq * row, q_local}});
  ops_->copy(jobs, s_.batch, stream);
  engine_->zero(b.dq, s_.batch * rq * s_.head_dim * 4, stream);
  if (ts) {
    engine_->forward(gathered_params(st, b.q, b.k, b.v, b.o, b.part_lse), stream);
    compute_delta(1, rq, rows_ref(b.o, st.nq), true, rows_ref(b.d_o, st.nq), rows_stats(b.delta, st.nq), stream);
  }
  bp.heads_q = bp.heads_kv = 1;
  bp.seqlen_q = rq;
  bp.seqlen_kv = rk;
  bp.q = rows_ref(b.q, st.nq);
  bp.k = rows_ref(b.k, st.nk);
  bp.v = rows_ref(b.v, st.nk);
  bp.d_o = rows_ref(b.d_o, st.nq);
  bp.lse = rows_stats(b.lse, st.nq);
  bp.delta = rows_stats(b.delta, st.nq);
  bp.dq = rows_ref(b.dq, st.nq);
  bp.dk = rows_ref(b.dk, st.nk);
  bp.dv = rows_ref(b.dv, st.nk);
  engine_->backward(bp, stream);  // the partials stay gathered until backward's last step sums them
}

void DilatedAttention::backward(const attnhost_backward_args& a) {
  void* compute = host_.stream(0);
  void* comm = overlap_ ? host_.stream(1) : compute;
  const Work& w = work_.backward();
  const size_t q_elems = size_t(s_.batch) * local_ * s_.heads_q * s_.head_dim;
  const size_t kv_elems = size_t(s_.batch) * local_ * s_.heads_kv * s_.head_dim;

  // delta of the final output: what makes every pattern's backward exact; the dQ accumulator
  // cleared in the same pass
  compute_delta(s_.heads_q, local_, local_ref(a.o.data, s_.heads_q), false, local_ref(a.d_o.data, s_.heads_q),
                local_stats(w.delta), compute, w.dq, q_elems * 4);
  if (dkdv_writer_ < 0) {
    engine_->zero(w.dk, kv_elems * 4, compute);
    engine_->zero(w.dv, kv_elems * 4, compute);
  }
  if (exchanges_) {
    engine_->wait(comm, compute);
    exchange_kv(a.k.data, a.v.data, w, comm);
  }
  const std::vector<void*> lanes = this->lanes();
  // The strided patterns' final LSE and delta rows, all in one launch: on a pattern's lane each
  // small copy waited for SMs that the other lanes' CTAs held (1.7 ms of copies in the profile of
  // S = 32768 causal, docs/KERNELS.md, "Lanes").
  std::vector<RowCopy> stats;
  for (size_t p = 0; p < patterns_.size(); ++p) {
    const PatternState& st = patterns_[p];
    if (!st.strided || st.pattern.r == 1 || st.host_segments.empty()) continue;
    for (const RowCopy& c : stats_gather(st, w.patterns[p], a, w)) stats.push_back(c);
  }
  ops_->copy(stats, s_.batch, compute);
  for (size_t i = 1; i < lanes.size(); ++i) engine_->wait(lanes[i], compute);  // delta, zeros and rows are in
  const auto run = [&](const std::vector<size_t>& list) {
    run_patterns(list, "dilated backward", lanes, schedule_.backward_lane,
                 [&](size_t p, void* stream) { pattern_backward(p, a, w, stream); });
  };
  if (exchanges_) engine_->wait(lanes.back(), comm);  // the remote patterns' lane (schedule())
  run(schedule_.remote);
  if (exchanges_) send_gradients(w, lanes.back(), comm);
  run(schedule_.first);
  // The gathered patterns lead schedule_.rest and start at once; a strided one on another lane
  // first waits for the dK/dV writer (lane 0, schedule_.first), whose values it adds to.
  const attncore::plugin::Engine::Event written = lanes.size() > 1 ? engine_->record(compute) : nullptr;
  std::vector<bool> after_writer(lanes.size(), false);
  for (size_t p : schedule_.rest) {
    const int lane = schedule_.backward_lane[p];
    if (dkdv_writer_ >= 0 && patterns_[p].strided && lane > 0 && !after_writer[lane]) {
      engine_->wait(lanes[lane], written);
      after_writer[lane] = true;
    }
    run({p});
  }
  for (size_t i = 1; i < lanes.size(); ++i) engine_->wait(compute, lanes[i]);
  if (exchanges_) add_gradients(w, compute, comm);

  // Each local row: its accumulator (strided patterns, returned partials) plus its gathered
  // partials (a key row: one per query head of its group), rounded once.
  const int32_t D = s_.head_dim;
  RowSum dq{a.dq.data, s_.dtype, w.dq, local_ * s_.heads_q, D, local_ * s_.heads_q * D, {}};
  RowSum dk{a.dk.data, s_.dtype, w.dk, local_ * s_.heads_kv, D, local_ * s_.heads_kv * D, {}};
  RowSum dv{a.dv.data, s_.dtype, w.dv, local_ * s_.heads_kv, D, local_ * s_.heads_kv * D, {}};
  for (size_t p = 0; p < patterns_.size(); ++p) {
    const PatternState& st = patterns_[p];
    if (st.strided || st.host_segments.empty()) continue;
    const PatternBuffers& b = w.patterns[p];
    const int64_t rq = s_.heads_q * st.nq * int64_t{D}, rk = s_.heads_q * st.nk * int64_t{D};
    dq.parts.push_back({b.dq, st.q_dst, 1, rq});
    dk.parts.push_back({b.dk, st.kv_dst, group_, rk});
    dv.parts.push_back({b.dv, st.kv_dst, group_, rk});
  }
  const int32_t range = host_.range_begin("dilated dQ/dK/dV sums", ATTNHOST_RANGE_COMPUTE, compute);
  for (const RowSum* r : {&dq, &dk, &dv}) ops_->sum(*r, s_.batch, compute);
  host_.range_end(range, compute);
}

}  // namespace dilated
