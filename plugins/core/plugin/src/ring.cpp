#include "attncore/plugin/ring.h"

#include "attncore/plugin/dense_plans.h"
#include "calls.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attncore::plugin {

namespace {

// Entries per slice when `total` is cut into `slices`: the slices are this size, the last what is left.
int32_t per_slice(int32_t total, int32_t slices) {
  slices = std::clamp(slices, 1, std::max(1, total));
  return (total + slices - 1) / slices;
}

// The shape of a slice of `batch` entries and `heads_kv` key/value heads (with their query heads).
RingShape slice_shape(const RingShape& s, int32_t batch, int32_t heads_kv) {
  RingShape slice = s;
  slice.batch = batch;
  slice.heads_q = heads_kv * (s.heads_q / s.heads_kv);
  slice.heads_kv = heads_kv;
  return slice;
}

// The largest slice: what the buffers are sized for.
RingShape largest_slice(const RingShape& s) {
  return slice_shape(s, per_slice(s.batch, s.batch_slices), per_slice(s.heads_kv, s.head_slices));
}

// The tensor from batch entry b0 on, for `batch` entries ([B, ...] and [B, H, S] alike).
attnhost_tensor from_entry(attnhost_tensor t, int64_t b0, int64_t batch) {
  if (t.data) t.data = static_cast<char*>(t.data) + b0 * t.strides[0] * static_cast<int64_t>(attnhost::dtype_size(t.dtype));
  t.shape[0] = batch;
  return t;
}

// A backward's every tensor cut to the batch entries of `slice` (b0 on, shape.batch of them).
template <class Slice> attnhost_backward_args entries_of(attnhost_backward_args a, const Slice& slice) {
  for (attnhost_tensor* t : {&a.q, &a.k, &a.v, &a.o, &a.lse, &a.d_o, &a.dq, &a.dk, &a.dv})
    *t = from_entry(*t, slice.b0, slice.shape.batch);
  return a;
}

// The smallest interval holding both.
Interval cover(Interval a, Interval b) {
  if (a.size() == 0) return b;
  if (b.size() == 0) return a;
  return {std::min(a.lo, b.lo), std::max(a.hi, b.hi)};
}

// What the member holding block `source` at `step` reaches of it, by [step * world + source].
std::vector<Interval> reached_table(const RingPlan& plan, int world) {
  std::vector<Interval> reached(size_t(world) * world);
  for (int step = 1; step < world; ++step)
    for (int src = 0; src < world; ++src)
      for (const BlockCall& c : plan((src + step) % world, src))
        reached[step * world + src] = cover(reached[step * world + src], {c.kv_begin, c.kv_end});
  return reached;
}

// What the hop into `step` carries of block `source`: what the members from there on reach.
std::vector<Interval> carried_table(const std::vector<Interval>& reached, int world) {
  std::vector<Interval> carried(reached.size());
  for (int step = world - 1; step >= 1; --step)
    for (int src = 0; src < world; ++src)
      carried[step * world + src] =
          cover(reached[step * world + src], step + 1 < world ? carried[(step + 1) * world + src] : Interval{});
  return carried;
}

// The columns of its own block a member keeps in fp32 where gradients go home: those that arrive
// (`arrive`), those several of its own calls reach, and those of a call that cannot be cut.
Interval kept_columns(const std::vector<BlockCall>& own, Interval arrive) {
  Interval kept = arrive;
  for (size_t i = 0; i < own.size(); ++i) {
    if (!dense(own[i])) kept = cover(kept, {own[i].kv_begin, own[i].kv_end});
    for (size_t j = i + 1; j < own.size(); ++j) {
      const Interval both{std::max(own[i].kv_begin, own[j].kv_begin), std::min(own[i].kv_end, own[j].kv_end)};
      if (both.size() > 0) kept = cover(kept, both);
    }
  }
  return kept;
}

}  // namespace

void set_block_reach(RingShape& s, const RingPlan& plan, int world_size) {
  s.carried_columns = s.kept_columns = -1;
  if (world_size == 1) return;
  const std::vector<Interval> carried = carried_table(reached_table(plan, world_size), world_size);
  int64_t most = 0, kept = 0;
  for (int m = 0; m < world_size; ++m) {
    most = std::max(most, carried[world_size + m].size());
    kept = std::max(kept, kept_columns(plan(m, m), carried[world_size + m]).size());
  }
  // Gradients home when each message home (fp32) is no longer than the travelling ring's last hop
  // (the block in the problem dtype), and the buffers (kept, then three pairs of carried columns)
  // take no more than its three fp32 pairs.
  const int64_t n = s.local_kv;
  if (4 * most <= int64_t(attnhost::dtype_size(s.dtype)) * n && 3 * most <= 2 * n && kept <= n) {
    s.carried_columns = most;
    s.kept_columns = kept;
  }
}

void set_joined_forward(RingShape& s, int world_size) {
  s.joined_forward = world_size == 2 && s.mask.window_left < 0 && s.mask.window_right < 0;
}

namespace {

// Whether a ring of `s` joins its forward (RingShape::joined_forward): only over several batch
// slices (the first runs the ring's steps) and heads whole (a packed slice's keys are not gathered).
bool joins_forward(const RingShape& s, int world_size) {
  return world_size == 2 && s.joined_forward && s.batch >= 2 && s.head_slices == 1;
}

}  // namespace

void set_own_last(RingShape& s, const RingPlan& plan, int world_size, bool dtype_partials) {
  s.own_last = world_size == 2 && s.carried_columns < 0 && !dtype_partials;
  for (int m = 0; m < world_size && s.own_last; ++m) {
    const std::vector<BlockCall> own = plan(m, m);
    s.own_last = own.size() == 1 && covers_all_keys(s, own[0]) && dense(own[0]);
  }
}

RingAttention::Packed RingAttention::take_packed(Carver& c, const RingShape& s) {
  const LocalSizes n = local_sizes(s);
  const size_t in = elem_size(s, Elem::input), out = elem_size(s, Elem::output);
  Packed p;
  for (void** buffer : {&p.q, &p.d_o}) *buffer = c.take(n.q * in);
  for (void** buffer : {&p.o, &p.dq}) *buffer = c.take(n.q * out);
  for (void** buffer : {&p.k, &p.v}) *buffer = c.take(n.kv * in);
  for (void** buffer : {&p.dk, &p.dv}) *buffer = c.take(n.kv * out);
  p.lse = c.take<float>(n.rows * 4);
  return p;
}

RingAttention::Buffers RingAttention::layout(Carver& c, Pass pass, const RingShape& shape, int world_size) {
  return carve(c, pass, pass == Pass::forward ? forward_shape(shape, world_size) : shape, world_size);
}

// Calls over more entries fill the GPU's waves better: a zigzag rank's forward calls at medium on two
// ranks (24 heads, 2048 rows), timed alone on one H200, sum to 1.70 ms in four slices of one entry
// and 1.53 in two of two, which fit in the same memory (docs/KERNELS.md, "The forward's batch slices").
RingShape RingAttention::forward_shape(const RingShape& shape, int world_size) {
  RingShape f = shape;
  if (shape.forward_batch_slices > 0) f.batch_slices = shape.forward_batch_slices;
  if (shape.forward_batch_slices > 0 || world_size == 1) return f;
  // A joined forward runs its first slice the ring's way and gathers each later one's keys under the
  // one before: an entry a slice joins the most of it, in the least memory. (Capped at the backward's
  // slices, its key buffers had the memory rule cut the backward finer: at large on two H200s, zigzag's
  // backward 21.5 -> 23.0-23.3 ms.)
  if (joins_forward(shape, world_size)) {
    f.batch_slices = shape.batch;
    return f;
  }
  if (shape.batch_slices <= 1) return f;
  Carver backward;
  carve(backward, Pass::backward, shape, world_size);
  for (f.batch_slices = 1; f.batch_slices < shape.batch_slices; ++f.batch_slices) {
    Carver forward;
    carve(forward, Pass::forward, f, world_size);
    if (forward.used() <= backward.used()) break;
  }
  return f;
}

RingAttention::Buffers RingAttention::carve(Carver& c, Pass pass, const RingShape& shape, int world_size) {
  const RingShape s = largest_slice(shape);
  Buffers b;
  if (world_size > 1)
    for (KV& r : b.receive) r = {c.take(block_bytes(s)), c.take(block_bytes(s))};
  if (s.heads_kv < shape.heads_kv) b.packed = take_packed(c, s);
  b.rows[0] = take_row_buffers(c, pass, s);
  if (pass == Pass::forward) {
    // (After the receive buffers, which a backward's first block sent by the forward lands beside.)
    if (joins_forward(shape, world_size))
      for (KV& j : b.joined) j = {c.take(2 * block_bytes(s)), c.take(2 * block_bytes(s))};
    return b;
  }
  if (s.double_rows) b.rows[1] = take_row_buffers(c, pass, s);
  if (s.own_last) b.rows[2] = take_row_buffers(c, pass, s);
  if (world_size > 1 && s.carried_columns >= 0) {
    const size_t column = size_t(s.batch) * s.heads_kv * s.head_dim * 4;
    b.kept = {c.take(column * s.kept_columns), c.take(column * s.kept_columns)};
    for (KV& g : b.grads) g = {c.take(column * s.carried_columns), c.take(column * s.carried_columns)};
  } else {
    const size_t grad = local_sizes(s).kv * 4;
    for (int i = 0; i < (world_size > 1 ? 3 : 1); ++i) b.grads[i] = {c.take(grad), c.take(grad)};
  }
  return b;
}

size_t RingAttention::workspace_bytes(const RingShape& shape, int world_size) {
  return Workspace<Buffers>::bytes([&](Carver& c, Pass pass) { return layout(c, pass, shape, world_size); });
}

size_t RingAttention::block_bytes(const RingShape& s) {
  const int64_t columns = s.carried_columns >= 0 ? s.carried_columns : s.local_kv;
  return size_t(s.batch) * columns * s.heads_kv * s.head_dim * attnhost::dtype_size(s.dtype);
}

RingAttention::RingAttention(const RingShape& shape, RingPlan plan, const ScheduleOptions& options, RingMembers members)
    : s_(shape), forward_s_(forward_shape(shape, members.size)), plan_(std::move(plan)), host_(options.host),
      members_(members), rank_(members.position),
      world_(members.size), overlap_(options.overlap), dtype_partials_(options.engine.dtype_partials),
      engine_(options.make_engine()),
      work_(options.host,
            [&](Carver& c, Pass pass) { return carve(c, pass, pass == Pass::forward ? forward_s_ : s_, world_); }),
      fill_(overlap_ && host_.stream(3) ? host_.stream(3) : host_.stream(0)) {}

void RingAttention::plan_reach() {
  if (!carried_.empty() || world_ == 1) return;
  reached_ = reached_table(plan_, world_);
  carried_ = carried_table(reached_, world_);
  if (s_.carried_columns < 0) return;
  for (int src = 0; src < world_; ++src)
    if (carried(1, src).size() > s_.carried_columns)
      attnhost::fail(ATTNHOST_ERR_INTERNAL, "schedule: a block carries more columns than its shape was sized for");
}

RingAttention::Columns RingAttention::held(int step, int src, void* data) const {
  if (step == 0 || s_.carried_columns < 0) return {data, s_.local_kv, 0, s_.dtype};
  const Interval c = carried(1, src);
  return {data, c.size(), c.lo, s_.dtype};
}

void RingAttention::transfer(bool send, const Columns& b, const Columns& peer_b, Interval cols, int peer,
                             const RingShape& s, void* stream) {
  if (cols.size() == 0) return;
  const size_t token = size_t(s.heads_kv) * s.head_dim, el = attnhost::dtype_size(b.dtype);
  const int world_peer = members_.rank_of(peer);
  const auto move = [&](char* at, size_t count) {
    if (send) host_.send(at, count, b.dtype, world_peer, stream);
    else host_.recv(at, count, b.dtype, world_peer, stream);
  };
  const auto whole = [&](const Columns& x) { return cols.lo == x.first && cols.hi == x.first + x.width; };
  char* base = static_cast<char*>(b.data);
  if (whole(b) && whole(peer_b)) return move(base, size_t(s.batch) * b.width * token);
  for (int32_t batch = 0; batch < s.batch; ++batch)
    move(base + (size_t(batch) * b.width + (cols.lo - b.first)) * token * el, cols.size() * token);
}

TensorRef RingAttention::view(const Columns& b, int64_t column, const RingShape& s) const {
  const int64_t token = int64_t{s.heads_kv} * s.head_dim;
  return {static_cast<char*>(b.data) + (column - b.first) * token * attnhost::dtype_size(b.dtype), b.width * token,
          token, s.head_dim};
}

bool RingAttention::pass_kv(const RingShape& s, KV in_hand, KV into, int step, void* stream) {
  const int out_src = source(step), in_src = source(step + 1);
  const Interval out = carried(step + 1, out_src), in = carried(step + 1, in_src);
  if (out.size() == 0 && in.size() == 0) return false;
  const int next = (rank_ + 1) % world_, prev = (rank_ + world_ - 1) % world_;
  const std::string name = "K V step " + std::to_string(step);
  const int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMMUNICATION, stream);
  host_.group_start();
  for (void* t : {in_hand.k, in_hand.v}) transfer(true, held(step, out_src, t), held(step + 1, out_src, nullptr), out, next, s, stream);
  for (void* t : {into.k, into.v}) transfer(false, held(step + 1, in_src, t), held(step, in_src, nullptr), in, prev, s, stream);
  host_.group_end();
  host_.range_end(range, stream);
  return true;
}

std::vector<RingAttention::Slice> RingAttention::slices(const RingShape& sliced, int32_t first, int32_t count) const {
  const int32_t per_b = per_slice(s_.batch, sliced.batch_slices), per_h = per_slice(s_.heads_kv, s_.head_slices);
  const int32_t end = std::min(first + count, s_.batch);
  std::vector<Slice> out;
  for (int32_t b0 = first; b0 < end; b0 += per_b)
    for (int32_t h0 = 0; h0 < s_.heads_kv; h0 += per_h) {
      const int32_t nb = std::min(per_b, end - b0), nh = std::min(per_h, s_.heads_kv - h0);
      out.push_back({slice_shape(s_, nb, nh), b0, h0, nh < s_.heads_kv, false});
    }
  if (!out.empty()) out.back().last = true;
  return out;
}

void RingAttention::move_heads(void* packed, void* full, Kind kind, size_t el, const Slice& slice, bool pack,
                               void* stream) {
  const RingShape& s = slice.shape;
  const int32_t group = s_.heads_q / s_.heads_kv;
  const size_t row = s_.head_dim * el;
  int64_t rows = int64_t{s.batch} * s.local_q;
  int32_t heads = s_.heads_q, h0 = slice.h0 * group, n = s.heads_q;
  size_t unit = row;
  if (kind == Kind::kv) {
    rows = int64_t{s.batch} * s.local_kv;
    heads = s_.heads_kv;
    h0 = slice.h0;
    n = s.heads_kv;
  } else if (kind == Kind::stats) {
    rows = s.batch;
    unit = s.local_q * sizeof(float);
  }
  char* at = static_cast<char*>(full) + h0 * unit;
  if (pack) engine_->copy_rows(packed, n * unit, at, heads * unit, n * unit, rows, stream);
  else engine_->copy_rows(at, heads * unit, packed, n * unit, n * unit, rows, stream);
}

void RingAttention::pack(const Slice& slice, std::vector<Swap>& swaps, void* stream) {
  for (Swap& w : swaps) {
    w.full = w.t->data;
    if (w.input) move_heads(w.buffer, w.full, w.kind, attnhost::dtype_size(w.t->dtype), slice, true, stream);
    w.t->data = w.buffer;
  }
}

void RingAttention::unpack(const Slice& slice, const std::vector<Swap>& swaps, void* stream) {
  for (const Swap& w : swaps)
    if (!w.input) move_heads(w.buffer, w.full, w.kind, attnhost::dtype_size(w.t->dtype), slice, false, stream);
}

void RingAttention::exchange(const void* send_k, const void* send_v, void* recv_k, void* recv_v, int32_t dtype,
                             size_t count, void* stream, const char* what, int step) {
  const int next = members_.rank_of((rank_ + 1) % world_), prev = members_.rank_of((rank_ + world_ - 1) % world_);
  std::string name = std::string(what) + " step " + std::to_string(step);
  int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMMUNICATION, stream);
  host_.group_start();
  host_.send(send_k, count, dtype, next, stream);
  host_.send(send_v, count, dtype, next, stream);
  host_.recv(recv_k, count, dtype, prev, stream);
  host_.recv(recv_v, count, dtype, prev, stream);
  host_.group_end();
  host_.range_end(range, stream);
}

void RingAttention::forward(const attnhost_forward_args& a) {
  const Engine::Event begun = engine_->record(host_.stream(0));  // the inputs, and the last pass done
  forward(a, 0, s_.batch);
  prefetched_ = prefetch_backward_kv(a, begun);
  if (!prefetched_.made) prefetched_ = forward_hop_kept(a);
  engine_->wait(host_.stream(0), prefetched_.arrived);  // the pass ends with its last transfer
  report_amax(*engine_, s_, a, host_.stream(0));
}

RingAttention::Prefetch RingAttention::prefetch_backward_kv(const attnhost_forward_args& a,
                                                             const Engine::Event& begun) {
  if (world_ != 2 || !s_.own_last) return {};
  const std::vector<Slice> list = slices(s_, 0, s_.batch);
  if (list.size() < 2 || list[0].packed) return {};
  // The backward's first receive buffer lies where the forward's first does, which two members never
  // use (their one hop goes into the second): checked, as the two layouts are carved apart.
  const KV into = work_.backward().receive[0];
  const char* end = static_cast<char*>(into.v) + block_bytes(list[0].shape);
  if (end > static_cast<char*>(work_.forward().receive[1].k)) return {};
  void* comm = overlap_ ? host_.stream(1) : host_.stream(0);
  engine_->wait(comm, begun);  // not before the last backward has read the buffer
  const Slice& first = list[0];
  const KV mine{from_entry(a.k, first.b0, first.shape.batch).data, from_entry(a.v, first.b0, first.shape.batch).data};
  pass_kv(first.shape, mine, into, 0, comm);
  return {true, a.k, a.v, engine_->record(comm)};
}

RingAttention::Prefetch RingAttention::forward_hop_kept(const attnhost_forward_args& a) {
  if (world_ != 2 || s_.carried_columns < 0) return {};
  const std::vector<Slice> fwd = slices(forward_s_, 0, s_.batch), bwd = slices(s_, 0, s_.batch);
  if (fwd.size() != 1 || bwd.size() != 1 || fwd[0].packed || bwd[0].packed) return {};
  const KV f = work_.forward().receive[1], b = work_.backward().receive[1];
  if (f.k != b.k || f.v != b.v || block_bytes(fwd[0].shape) != block_bytes(bwd[0].shape)) return {};
  // The compute stream waited for the hop before the forward's last step.
  return {true, a.k, a.v, engine_->record(host_.stream(0))};
}

void RingAttention::forward(const attnhost_forward_args& a, int32_t b0, int32_t count) {
  prefetched_ = {};
  plan_reach();
  void* compute = host_.stream(0);
  const std::vector<Slice> list = slices(forward_s_, b0, count);
  if (joins(list)) return forward_joined(a, list);
  for (const Slice& slice : list) {
    attnhost_forward_args x = a;
    for (attnhost_tensor* t : {&x.q, &x.k, &x.v, &x.o, &x.lse}) *t = from_entry(*t, slice.b0, slice.shape.batch);
    if (!slice.packed) {
      forward_slice(slice.shape, x);
      continue;
    }
    const Packed& p = work_.forward().packed;
    std::vector<Swap> swaps = {{&x.q, p.q, Kind::q, true},       {&x.k, p.k, Kind::kv, true},
                               {&x.v, p.v, Kind::kv, true},      {&x.o, p.o, Kind::q, false},
                               {&x.lse, p.lse, Kind::stats, false}};
    pack(slice, swaps, compute);
    forward_slice(slice.shape, x);
    unpack(slice, swaps, compute);
  }
}

bool RingAttention::joins(const std::vector<Slice>& list) const {
  if (!joins_forward(s_, world_) || !runs_ || s_.carried_columns >= 0 || list.size() < 2) return false;
  for (const Slice& slice : list)
    if (slice.packed) return false;
  for (int source : {0, 1})
    for (const BlockCall& c : plan_(rank_, source))
      if (!dense(c)) return false;
  return true;
}

const RingAttention::Joined& RingAttention::joined() {
  if (joined_) return *joined_;
  // Runs of consecutive tokens of a block, neighbours in both orders joined (zigzag's two chunks on
  // the member whose chunks meet).
  const auto runs_of = [&](int member) {
    std::vector<Joined::Piece> out;
    const attnhost::Layout layout = runs_(member);
    const attnhost_layout l = layout.view();
    for (int32_t i = 0; i < l.num_ranges; ++i) {
      const attnhost_token_range& r = l.ranges[i];
      if (!out.empty() && out.back().global + out.back().length == r.global_begin &&
          out.back().local + out.back().length == r.local_begin)
        out.back().length += r.length;
      else
        out.push_back({r.global_begin, r.local_begin, r.length});
    }
    return out;
  };
  // Without a window every row reaches keys from the first on: a run of rows reaches [0, what its
  // last row reaches).
  const auto reach = [&](const std::vector<Joined::Piece>& rows) {
    int64_t width = 0;
    for (const Joined::Piece& r : rows) width = std::max(width, s_.mask.keys_of(r.global + r.length - 1).hi);
    return width;
  };
  const auto within = [](const std::vector<Joined::Piece>& runs, int64_t width) {
    std::vector<Joined::Piece> out;
    for (Joined::Piece r : runs)
      if (r.global < width) out.push_back({r.global, r.local, std::min(r.length, width - r.global)});
    return out;
  };
  const int peer = 1 - rank_;
  const std::vector<Joined::Piece> mine = runs_of(rank_), theirs = runs_of(peer);
  Joined j;
  j.width = reach(mine);
  j.copied = within(mine, j.width);
  j.received = within(theirs, j.width);
  j.sent = within(mine, reach(theirs));
  for (const Joined::Piece& r : mine) {
    std::optional<BlockCall> c = dense_call(s_.mask, r.local, r.global, r.length, 0, 0, j.width);
    if (!c) continue;
    bool own = false;
    for (const Joined::Piece& k : mine)  // the keys lie in one run of this block: no gathered copy needed
      if (k.global <= c->kv_pos0 && c->kv_pos0 + (c->kv_end - c->kv_begin) <= k.global + k.length) {
        c->kv_begin += k.local - k.global;
        c->kv_end += k.local - k.global;
        own = true;
        break;
      }
    j.calls.push_back({*c, own});
  }
  joined_ = std::move(j);
  return *joined_;
}

// The first slice runs the ring's two steps, its own block under the hop. The keys each later slice's
// rows reach are gathered into joined[i % 2] on the communication stream (the other member's by
// message, this member's own by a copy) while the compute stream runs the slice before: gathered
// first, a slice would wait for its keys with nothing to compute (zigzag's member 1 reaches the
// other's keys from its first row). Slice i + 1's messages go out once slice i - 1's calls have read
// that buffer. A slice's calls over its own keys alone (member 0's early chunk) go first.
void RingAttention::forward_joined(const attnhost_forward_args& a, const std::vector<Slice>& list) {
  void* compute = host_.stream(0);
  void* comm = overlap_ ? host_.stream(1) : compute;
  const Buffers& w = work_.forward();
  const Joined& j = joined();
  const int peer = 1 - rank_;
  const size_t token = size_t(s_.heads_kv) * s_.head_dim, el = attnhost::dtype_size(s_.dtype);
  const auto gather = [&](size_t i) {
    const Slice& slice = list[i];
    const int32_t nb = slice.shape.batch;
    const KV into = w.joined[i % 2];
    const KV own{from_entry(a.k, slice.b0, nb).data, from_entry(a.v, slice.b0, nb).data};
    const int32_t range = host_.range_begin("K V gathered", ATTNHOST_RANGE_COMMUNICATION, comm);
    host_.group_start();
    for (auto [from, to] : {std::pair{own.k, into.k}, std::pair{own.v, into.v}}) {
      for (const Joined::Piece& p : j.sent)
        for (int32_t b = 0; b < nb; ++b)
          host_.send(static_cast<char*>(from) + (size_t(b) * s_.local_kv + p.local) * token * el, p.length * token,
                     s_.dtype, members_.rank_of(peer), comm);
      for (const Joined::Piece& p : j.received)
        for (int32_t b = 0; b < nb; ++b)
          host_.recv(static_cast<char*>(to) + (size_t(b) * j.width + p.global) * token * el, p.length * token, s_.dtype,
                     members_.rank_of(peer), comm);
    }
    host_.group_end();
    for (auto [from, to] : {std::pair{own.k, into.k}, std::pair{own.v, into.v}})
      for (const Joined::Piece& p : j.copied)
        engine_->copy_rows(static_cast<char*>(to) + p.global * token * el, j.width * token * el,
                           static_cast<char*>(from) + p.local * token * el, s_.local_kv * token * el,
                           p.length * token * el, nb, comm);
    host_.range_end(range, comm);
    return engine_->record(comm);
  };

  const auto entries = [&](const Slice& slice) {
    attnhost_forward_args x = a;
    for (attnhost_tensor* t : {&x.q, &x.k, &x.v, &x.o, &x.lse}) *t = from_entry(*t, slice.b0, slice.shape.batch);
    return x;
  };
  forward_slice(list[0].shape, entries(list[0]));  // (its hop first on the communication stream)
  std::vector<Engine::Event> gathered(list.size()), read(list.size());
  gathered[1] = gather(1);
  for (size_t i = 1; i < list.size(); ++i) {
    const Slice& slice = list[i];
    const attnhost_forward_args x = entries(slice);
    OutputAccumulator out(slice.shape, *engine_, w.rows[0], static_cast<float*>(x.lse.data), x.o.data);
    const Columns keys[2] = {{w.joined[i % 2].k, j.width, 0, s_.dtype}, {w.joined[i % 2].v, j.width, 0, s_.dtype}};
    const auto run = [&](const BlockCall& c, bool own) {
      const int32_t range = host_.range_begin("attention joined", ATTNHOST_RANGE_COMPUTE, compute);
      ForwardParams p = forward_params(slice.shape, c, x.q.data, x.k.data, x.v.data, fp8_scaling(a));
      if (!own) {
        p.k = view(keys[0], c.kv_begin, slice.shape);
        p.v = view(keys[1], c.kv_begin, slice.shape);
      }
      out.run(p, OutputCall{c, true, true}, compute);
      host_.range_end(range, compute);
    };
    for (const auto& [c, own] : j.calls)
      if (own) run(c, true);
    if (i + 1 < list.size()) {
      if (i >= 2) engine_->wait(comm, read[i - 1]);  // slice i - 1's calls have read the buffer
      gathered[i + 1] = gather(i + 1);
    }
    engine_->wait(compute, gathered[i]);
    for (const auto& [c, own] : j.calls)
      if (!own) run(c, false);
    read[i] = engine_->record(compute);
    out.finish(compute);
  }
  engine_->wait(compute, comm);  // (every message done before the pass ends)
}

void RingAttention::forward_slice(const RingShape& s, const attnhost_forward_args& a) {
  void* compute = host_.stream(0);
  void* comm = overlap_ ? host_.stream(1) : compute;
  const Buffers& w = work_.forward();
  std::vector<std::vector<BlockCall>> steps(world_);
  for (int step = 0; step < world_; ++step) steps[step] = plan_(rank_, source(step));
  const std::vector<std::vector<OutputCall>> plans = output_calls(steps);
  OutputAccumulator out(s, *engine_, w.rows[0], static_cast<float*>(a.lse.data), a.o.data);

  // A step's kernels are enqueued before its hop: the host's time launching the messages then passes
  // while the GPU computes, and the hop still starts with the step.
  for (int step = 0; step < world_; ++step) {
    KV cur = step == 0 ? KV{a.k.data, a.v.data} : w.receive[step % 2];
    const Engine::Event read = engine_->record(compute);  // the previous step has read its block
    for (const OutputCall& c : plans[step]) {
      std::string name = "attention step " + std::to_string(step);
      int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMPUTE, compute);
      ForwardParams p = forward_params(s, c.call, a.q.data, cur.k, cur.v, fp8_scaling(a));
      p.k = view(held(step, source(step), cur.k), c.call.kv_begin, s);
      p.v = view(held(step, source(step), cur.v), c.call.kv_begin, s);
      out.run(p, c, compute);  // direct, first on its rows, or merged
      host_.range_end(range, compute);
    }
    if (step + 1 < world_) {
      engine_->wait(comm, read);  // the receive buffer was read by the previous step
      if (pass_kv(s, cur, w.receive[(step + 1) % 2], step, comm)) engine_->wait(compute, comm);  // the next block has arrived
    }
  }
  out.finish(compute);  // rows no call reached: O = 0, LSE = -inf; O in the problem dtype
}

void RingAttention::backward(const attnhost_backward_args& a) {
  const Prefetch sent = std::exchange(prefetched_, {});
  const auto same = [](const attnhost_tensor& x, const attnhost_tensor& y) {
    return x.data == y.data && x.dtype == y.dtype && x.ndim == y.ndim && std::equal(x.shape, x.shape + x.ndim, y.shape) &&
           std::equal(x.strides, x.strides + x.ndim, y.strides);
  };
  const bool same_kv = sent.made && same(sent.k, a.k) && same(sent.v, a.v);
  plan_reach();
  const std::vector<Slice> list = slices(s_, 0, s_.batch);
  if (same_kv && s_.own_last && list.size() > 1) {
    const Engine::Event inputs = engine_->record(host_.stream(0));
    engine_->wait(host_.stream(0), backward_own_last(a, list, inputs, sent));
  } else {
    // (own_last and gradients home exclude each other: a kept hop is forward_hop_kept's.)
    engine_->wait(host_.stream(0), backward_entries(a, 0, s_.batch, same_kv ? sent : Prefetch{}));
  }
  report_amax(*engine_, s_, a, host_.stream(0));  // every output is home on the compute stream by now
}

Engine::Event RingAttention::prepare(const attnhost_backward_args& whole, const Slice& slice, const RowBuffers& rows,
                                     const Engine::Event& inputs, const EarlyRows* early) {
  attnhost_backward_args x = whole;
  for (attnhost_tensor* t : {&x.o, &x.d_o}) *t = from_entry(*t, slice.b0, slice.shape.batch);
  if (!early) {
    engine_->wait(fill_, inputs);
    compute_local_delta(slice.shape, *engine_, x, rows.delta, rows.dq, fill_);
    return engine_->record(fill_);
  }
  // dQ's clearing is most of the pass's bytes (fp32 against two inputs in the dtype), and needs no
  // input: it goes with the early rows.
  engine_->wait(fill_, early->ready);
  compute_local_delta(slice.shape, *engine_, x, rows.delta, rows.dq, early->rows, true, fill_);
  engine_->wait(fill_, inputs);
  for (const Interval rest : {Interval{0, early->rows.lo}, Interval{early->rows.hi, slice.shape.local_q}})
    if (rest.size() > 0) compute_local_delta(slice.shape, *engine_, x, rows.delta, rows.dq, rest, false, fill_);
  return engine_->record(fill_);
}

// Each slice's delta and zeroed fp32 dQ (its prologue) and its dQ rounded out (its epilogue) are
// memory passes. On the compute stream they left 125 us between a slice's last step and the next
// one's first at medium on two H200s; on the fill stream, with two row sets, the next slice's
// prologue runs under this one's steps and this one's epilogue under the next one's (docs/KERNELS.md,
// "Filling the last wave"). A slice of packed heads keeps both on the compute stream, between its
// pack and unpack.
Engine::Event RingAttention::backward(const attnhost_backward_args& a, int32_t b0, int32_t count) {
  return backward_entries(a, b0, count, Prefetch{});
}

Engine::Event RingAttention::backward_entries(const attnhost_backward_args& a, int32_t b0, int32_t count,
                                              const Prefetch& kept) {
  plan_reach();
  void* compute = host_.stream(0);
  const std::vector<Slice> list = slices(s_, b0, count);
  const Engine::Event inputs = engine_->record(compute);  // the caller's O and dO
  prefetched_ = {};
  if (s_.own_last && list.size() > 1) return backward_own_last(a, list, inputs, Prefetch{});
  const size_t sets = s_.double_rows ? 2 : 1;            // slice i takes rows[i % sets]
  Engine::Event ahead;  // slice i's prologue, where slice i - 1 made it (ahead_made)
  bool ahead_made = false;
  for (size_t i = 0; i < list.size(); ++i) {
    const Slice& slice = list[i];
    attnhost_backward_args x = entries_of(a, slice);
    if (slice.packed) {
      const Packed& p = work_.backward().packed;
      const RowBuffers& rows = work_.backward().rows[0];
      std::vector<Swap> swaps = {{&x.q, p.q, Kind::q, true},     {&x.o, p.o, Kind::q, true},
                                 {&x.d_o, p.d_o, Kind::q, true}, {&x.lse, p.lse, Kind::stats, true},
                                 {&x.k, p.k, Kind::kv, true},    {&x.v, p.v, Kind::kv, true},
                                 {&x.dq, p.dq, Kind::q, false},  {&x.dk, p.dk, Kind::kv, false},
                                 {&x.dv, p.dv, Kind::kv, false}};
      pack(slice, swaps, compute);
      compute_local_delta(slice.shape, *engine_, x, rows.delta, rows.dq, compute);
      backward_slice(slice.shape, x, true, rows, nullptr, {});  // (dK and dV must be home: they are unpacked next)
      convert_out(slice.shape, *engine_, rows.dq, x.dq.data, false, compute);
      unpack(slice, swaps, compute);
      continue;
    }
    const RowBuffers& rows = work_.backward().rows[i % sets];
    const Engine::Event ready = ahead_made ? ahead : prepare(a, slice, rows, inputs);
    ahead_made = sets == 2 && i + 1 < list.size();  // the next slice's, under this slice's steps
    if (ahead_made) ahead = prepare(a, list[i + 1], work_.backward().rows[(i + 1) % sets], inputs);
    backward_slice(slice.shape, x, slice.last, rows, ready, i == 0 ? kept : Prefetch{});
    engine_->wait(fill_, engine_->record(compute));
    convert_out(slice.shape, *engine_, rows.dq, x.dq.data, false, fill_);
  }
  return engine_->record(fill_);
}

bool RingAttention::takes_runs() const {
  if (world_ != 1) return false;
  const std::vector<Slice> list = slices(s_, 0, s_.batch);
  const std::vector<BlockCall> calls = plan_(rank_, 0);
  return list.size() == 1 && !list[0].packed && calls.size() == 1 && dense(calls[0]) && covers_all_keys(s_, calls[0]);
}

void RingAttention::backward_in_runs(const attnhost_backward_args& a, int32_t b0, int32_t count,
                                     const std::vector<ColumnRun>& runs, void* rounding, void* lead,
                                     const std::function<void(size_t)>& after) {
  backward_runs(a, b0, count, runs, rounding, lead, after, nullptr);
}

void RingAttention::backward_in_runs(const attnhost_backward_args& a, int32_t b0, int32_t count,
                                     const std::vector<ColumnRun>& runs, void* rounding, void* lead,
                                     const std::function<void(size_t)>& after, const EarlyRows& early) {
  backward_runs(a, b0, count, runs, rounding, lead, after, &early);
}

void RingAttention::backward_runs(const attnhost_backward_args& a, int32_t b0, int32_t count,
                                  const std::vector<ColumnRun>& runs, void* rounding, void* lead,
                                  const std::function<void(size_t)>& after, const EarlyRows* early) {
  plan_reach();
  void* compute = host_.stream(0);
  const Slice slice = slices(s_, b0, count).front();  // the one slice, not packed (takes_runs)
  const RingShape& s = slice.shape;
  const attnhost_backward_args x = entries_of(a, slice);
  const RowBuffers& rows = work_.backward().rows[0];
  const LocalViews views{s};
  prefetched_ = {};
  engine_->wait(compute, prepare(a, slice, rows, engine_->record(compute), early));
  const BlockCall whole = plan_(rank_, 0).front();
  std::vector<BackwardParams> calls;
  for (const ColumnRun& run : runs) {
    // The whole call covers every column (takes_runs), and a mask's visible keys move by at most one
    // a row, so some row sees each column: each run's call is its columns whole, every one written.
    const std::optional<BlockCall> cut = dense_call(s.mask, whole.q_begin, whole.q_pos0, whole.q_end - whole.q_begin,
                                                    run.columns.lo, whole.kv_pos0 + (run.columns.lo - whole.kv_begin),
                                                    run.columns.size());
    if (!cut) attnhost::fail(ATTNHOST_ERR_INTERNAL, "a run of columns that no row sees");
    const BlockCall& c = *cut;
    BackwardParams p = backward_params(s, c, x, x.k.data, x.v.data, rows.delta, rows.dq, nullptr, nullptr);
    write_dkdv_into(p, s, c, x);
    if (run.dk.data) p.dk = run.dk;  // (the call starts at the run's first column)
    if (run.dv.data) p.dv = run.dv;
    calls.push_back(p);
  }
  bool beside = lead != nullptr && !s.deterministic;
  for (const BackwardParams& p : calls) beside = beside && engine_->adds_dq_atomically(p);
  if (beside) engine_->wait(lead, engine_->record(compute));
  std::vector<Engine::Event> written;
  for (size_t i = 0; i < runs.size(); ++i) {
    void* stream = beside && i == 0 ? lead : compute;
    const int32_t range = host_.range_begin("attention backward run", ATTNHOST_RANGE_COMPUTE, stream);
    engine_->backward(calls[i], stream);
    host_.range_end(range, stream);
    written.push_back(engine_->record(stream));
    for (const Engine::Event& e : written) engine_->wait(rounding, e);  // the rows finished need every run so far
    const auto round = [&](const RowsOut& r, void* st) {
      convert_rows_out(s, *engine_, rows.dq, r.dq.data ? r.dq : views.q(x.dq.data, r.rows.lo, Elem::output), r.rows,
                       st);
    };
    // After the last run, the rows that leave are rounded first and sent while those that stay are
    // rounded beside on the compute stream, idle by then: at medium on two H200s (B=4 S=8192 H=24
    // D=128, causal) each half of dQ took 45 us to round and the half that leaves 160 us to send
    // (docs/KERNELS.md, "Ulysses's backward: its edges").
    const bool split = i + 1 == runs.size();
    for (const RowsOut& r : runs[i].rows)
      if (!split || !r.dq.data) round(r, rounding);
    after(i);
    if (split) {
      for (const Engine::Event& e : written) engine_->wait(compute, e);
      for (const RowsOut& r : runs[i].rows)
        if (r.dq.data) round(r, compute);  // (the compute stream now follows every run)
    }
  }
}

// Slice i's step 1 (its share of the other member's block) runs before slice i - 1's step 0 (the
// own block), so that the share of the own block the other member made in step 1 has come home by
// then: on the compute stream 1(0) 1(1) 0(0) 1(2) 0(1) ... 1(n-1) 0(n-2) 0(n-1). A slice's rows
// live from its step 1 to its step 0 and dQ's rounding after it: three sets, slice i in set i % 3.
Engine::Event RingAttention::backward_own_last(const attnhost_backward_args& a, const std::vector<Slice>& list,
                                               const Engine::Event& inputs, const Prefetch& sent) {
  void* compute = host_.stream(0);
  void* comm = overlap_ ? host_.stream(1) : compute;
  const Buffers& w = work_.backward();
  const int peer = source(1);  // (two members: the one before is the one after)
  const size_t n = list.size();
  std::vector<attnhost_backward_args> args;
  for (const Slice& slice : list) args.push_back(entries_of(a, slice));
  const auto rows = [&](size_t i) -> const RowBuffers& { return w.rows[i % 3]; };
  // Slice i's share of the other's block is computed into one fp32 pair and sent home from it while
  // its share of this rank's block arrives in another, read by its step 0, which comes after the
  // next slice's step 1. Three pairs in turn: slice i computes into the pair slice i - 2's share
  // arrived in (read since by its step 0), and receives into the one slice i - 1 sent from (sent
  // since: the hops home are in order on their stream).
  const auto computed = [&](size_t i) { return w.grads[(3 - i % 3) % 3]; };
  const auto arriving = [&](size_t i) { return w.grads[(4 - i % 3) % 3]; };
  const Interval out = reached(1, peer), in = reached(1, rank_);
  const auto fp32_block = [&](void* data, const RingShape& s) { return Columns{data, s.local_kv, 0, ATTNHOST_DTYPE_FP32}; };

  std::vector<Engine::Event> prepared(n), kv_in(n), home(n);
  const auto hop = [&](size_t i) {  // slice i's block of the other member into receive[i % 2]
    const attnhost_backward_args& x = args[i];
    pass_kv(list[i].shape, {x.k.data, x.v.data}, w.receive[i % 2], 0, comm);
    kv_in[i] = engine_->record(comm);
  };
  engine_->wait(comm, inputs);
  if (sent.made) kv_in[0] = sent.arrived;  // the forward sent slice 0's block
  for (size_t i = sent.made ? 1 : 0; i < std::min<size_t>(n, 2); ++i) hop(i);
  for (size_t i = 0; i < std::min<size_t>(n, 3); ++i) prepared[i] = prepare(a, list[i], rows(i), inputs);

  const auto share = [&](size_t i) {  // step 1 of slice i, and its share home
    const RingShape& s = list[i].shape;
    const attnhost_backward_args& x = args[i];
    const KV cur = w.receive[i % 2], grad = computed(i);
    engine_->wait(compute, prepared[i]);
    engine_->wait(compute, kv_in[i]);
    const std::vector<BlockCall> calls = plan_(rank_, peer);
    // One dense call writes its columns, the only ones that go home, rather than adding into zeros.
    const bool writes = calls.size() == 1 && dense(calls[0]) && calls[0].q_end > calls[0].q_begin;
    if (!calls.empty() && !writes) {
      engine_->zero(grad.k, local_sizes(s).kv * 4, compute);
      engine_->zero(grad.v, local_sizes(s).kv * 4, compute);
    }
    for (const BlockCall& c : calls) {
      if (c.backward_segments && c.num_backward_segments == 0) continue;  // nothing attends: nothing to differentiate
      const int32_t range = host_.range_begin("attention backward step 1", ATTNHOST_RANGE_COMPUTE, compute);
      BackwardParams p = backward_params(s, c, x, cur.k, cur.v, rows(i).delta, rows(i).dq, static_cast<float*>(grad.k),
                                         static_cast<float*>(grad.v));
      p.write_dkdv = p.write_dkdv_fp32 = writes;
      engine_->backward(p, compute);
      host_.range_end(range, compute);
    }
    const Engine::Event read = engine_->record(compute);  // the block in hand is read, the share made
    engine_->wait(comm, read);
    const int32_t range = host_.range_begin("dK dV home", ATTNHOST_RANGE_COMMUNICATION, comm);
    host_.group_start();
    for (void* g : {grad.k, grad.v}) transfer(true, fp32_block(g, s), fp32_block(g, s), out, peer, s, comm);
    for (void* g : {arriving(i).k, arriving(i).v}) transfer(false, fp32_block(g, s), fp32_block(g, s), in, peer, s, comm);
    host_.group_end();
    host_.range_end(range, comm);
    home[i] = engine_->record(comm);
    if (i + 2 < n) hop(i + 2);  // into the buffer this step has read
  };
  const auto own = [&](size_t i) {  // step 0 of slice i, then its dQ rounded on the fill stream
    const RingShape& s = list[i].shape;
    const attnhost_backward_args& x = args[i];
    const BlockCall c = plan_(rank_, rank_)[0];
    engine_->wait(compute, home[i]);  // the other member's share of this block is here
    const int32_t range = host_.range_begin("attention backward step 0", ATTNHOST_RANGE_COMPUTE, compute);
    BackwardParams p = backward_params(s, c, x, x.k.data, x.v.data, rows(i).delta, rows(i).dq, nullptr, nullptr);
    write_dkdv_into(p, s, c, x);
    if (in.size() > 0) {
      p.dk_add = view(fp32_block(arriving(i).k, s), c.kv_begin, s);
      p.dv_add = view(fp32_block(arriving(i).v, s), c.kv_begin, s);
      p.add_begin = in.lo - c.kv_begin;
      p.add_end = in.hi - c.kv_begin;
    }
    engine_->backward(p, compute);
    host_.range_end(range, compute);
    engine_->wait(fill_, engine_->record(compute));
    convert_out(s, *engine_, rows(i).dq, x.dq.data, false, fill_);
    if (i + 3 < n) prepared[i + 3] = prepare(a, list[i + 3], rows(i + 3), inputs);  // into the set just freed
  };
  for (size_t i = 0; i < n; ++i) {
    share(i);
    if (i > 0) own(i - 1);
  }
  own(n - 1);
  return engine_->record(fill_);
}

void RingAttention::backward_slice(const RingShape& s, const attnhost_backward_args& a, bool last,
                                   const RowBuffers& rows, const Engine::Event& prologue, const Prefetch& kept) {
  if (s.carried_columns >= 0 && world_ > 1) return backward_home(s, a, rows, prologue, kept);
  void* compute = host_.stream(0);
  void* comm = overlap_ ? host_.stream(1) : compute;
  const size_t kv_elems = local_sizes(s).kv;
  const Buffers& w = work_.backward();
  float *delta = rows.delta, *dq = rows.dq;
  engine_->wait(compute, prologue);

  // The block in hand's gradients travel with it, summed on the way. Step i computes this rank's
  // share into a fresh pair (pair i % 2) while the sums of the ranks before it arrive in pair 2;
  // the communication stream adds them in once both are there and sends the total on. So no
  // kernel waits for a gradient hop: only the last step's sums wait, to go home in the problem dtype.
  Engine::Event grads_ready;  // the sums for the next step's block have arrived
  // The communication stream has done with pair 0, which the next slice's first step computes into:
  // it sent it at the last even step before the last, or it sums and rounds it at the last step.
  Engine::Event pair0_free;
  for (int step = 0; step < world_; ++step) {
    const KV cur = step == 0 ? KV{a.k.data, a.v.data} : w.receive[step % 2];
    const KV grad = w.grads[step % 2];  // sent two steps ago: its hop is done (ordered before kv_ready)
    const Engine::Event read = engine_->record(compute);  // the previous step has read its block
    // A step of one call over every key of the block writes its share rather than adding it into
    // zeros: on one rank in the problem dtype straight into dK and dV (no fp32 pair to convert),
    // else in fp32. (Not with dtype partials: there cuDNN serves the call, and it adds.)
    // So does one unmasked call over a run of the block's columns (zigzag's other rank reaching one
    // chunk of two): only the columns it does not reach are zeroed.
    const std::vector<BlockCall> calls = plan_(rank_, source(step));
    const bool covers = calls.size() == 1 && covers_all_keys(s, calls[0]);
    const bool run = calls.size() == 1 && !covers && world_ > 1 && !dtype_partials_ && dense(calls[0]) &&
                     !calls[0].masked && calls[0].q_end > calls[0].q_begin;
    const bool sole = covers && world_ == 1, writes = (covers && (sole || !dtype_partials_)) || run;
    if (!writes) {
      engine_->zero(grad.k, kv_elems * 4, compute);
      engine_->zero(grad.v, kv_elems * 4, compute);
    } else if (run) {
      zero_outside(s, grad, calls[0].kv_begin, calls[0].kv_end, compute);
    }
    for (const BlockCall& c : calls) {
      if (c.backward_segments && c.num_backward_segments == 0) continue;  // nothing attends: nothing to differentiate
      std::string name = "attention backward step " + std::to_string(step);
      int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMPUTE, compute);
      BackwardParams p = backward_params(s, c, a, cur.k, cur.v, delta, dq, static_cast<float*>(grad.k),
                                         static_cast<float*>(grad.v));
      p.k = view(held(step, source(step), cur.k), c.kv_begin, s);
      p.v = view(held(step, source(step), cur.v), c.kv_begin, s);
      if (sole) write_dkdv_into(p, s, c, a);
      else p.write_dkdv = p.write_dkdv_fp32 = writes;
      engine_->backward(p, compute);
      host_.range_end(range, compute);
    }
    Engine::Event kv_ready;  // (the hop after the step's kernels, as in the forward)
    if (step + 1 < world_) {
      engine_->wait(comm, read);  // the receive buffer was read by the previous step
      pass_kv(s, cur, w.receive[(step + 1) % 2], step, comm);
      kv_ready = engine_->record(comm);
    }
    if (world_ == 1) {
      if (!sole) {
        finish_kv_grad(s, static_cast<float*>(grad.k), a.dk.data, compute);
        finish_kv_grad(s, static_cast<float*>(grad.v), a.dv.data, compute);
      }
    } else if (step + 1 < world_) {
      const KV arriving = w.grads[2];
      engine_->wait(comm, compute);
      if (step > 0) {  // (after the previous hop on the same stream)
        engine_->add(static_cast<float*>(grad.k), static_cast<float*>(arriving.k), kv_elems, comm);
        engine_->add(static_cast<float*>(grad.v), static_cast<float*>(arriving.v), kv_elems, comm);
      }
      exchange(grad.k, grad.v, arriving.k, arriving.v, ATTNHOST_DTYPE_FP32, kv_elems, comm, "dK dV", step);
      grads_ready = engine_->record(comm);
      if (step % 2 == 0) pair0_free = grads_ready;
      engine_->wait(compute, kv_ready);
    } else {
      // The last hop takes finished sums home, so they are rounded to the output dtype before it
      // rather than after (the same values): half the bytes of the one hop nothing can hide, and
      // they land in dK and dV. The K/V buffer of step P - 2 is free to stage them; with FP8 K/V
      // it is too small for bf16, and the arriving pair stages them once added. Not pair 0: the
      // next slice's first step computes into it (the receives that write into the arriving pair
      // and the K/V buffer wait for this hop on this stream).
      // The sums and the rounding run on the communication stream (after the arriving sums, in its
      // order), under the next slice's first step: on the compute stream they held every slice's
      // next step back (docs/KERNELS.md, "Travelling dK/dV"). One pass adds and rounds, except where
      // the arriving pair itself stages (FP8): there the sum goes into this step's pair first.
      const bool wider = elem_size(s, Elem::output) > elem_size(s, Elem::input);
      const KV arriving = w.grads[2];
      const KV staged = s.kv_grads_fp32 ? grad : wider ? arriving : w.receive[world_ % 2];
      engine_->wait(comm, compute);
      const bool add_first = s.kv_grads_fp32 || wider;
      if (add_first) {
        engine_->add(static_cast<float*>(grad.k), static_cast<float*>(arriving.k), kv_elems, comm);
        engine_->add(static_cast<float*>(grad.v), static_cast<float*>(arriving.v), kv_elems, comm);
      }
      if (!s.kv_grads_fp32) {
        convert_out(s, *engine_, static_cast<float*>(grad.k), staged.k, true, comm,
                    add_first ? nullptr : static_cast<float*>(arriving.k));
        convert_out(s, *engine_, static_cast<float*>(grad.v), staged.v, true, comm,
                    add_first ? nullptr : static_cast<float*>(arriving.v));
      }
      if (step % 2 == 0 && !s.kv_grads_fp32) pair0_free = engine_->record(comm);
      exchange(staged.k, staged.v, a.dk.data, a.dv.data, s.kv_grads_fp32 ? ATTNHOST_DTYPE_FP32 : output_dtype(s),
               kv_elems, comm, "dK dV", step);
      grads_ready = engine_->record(comm);
      if (step % 2 == 0 && s.kv_grads_fp32) pair0_free = grads_ready;  // (sent home from pair 0 itself)
    }
  }
  // dK and dV are home (every slice's: the hops are in order). A slice before the last leaves its
  // hop under the next slice's first step, once pair 0 is free.
  engine_->wait(compute, last ? grads_ready : pair0_free);
}

void RingAttention::backward_home(const RingShape& s, const attnhost_backward_args& a, const RowBuffers& rows,
                                  const Engine::Event& prologue, const Prefetch& kept_hop) {
  void* compute = host_.stream(0);
  void* comm = overlap_ ? host_.stream(1) : compute;
  const int64_t token = int64_t{s.heads_kv} * s.head_dim;
  const Buffers& w = work_.backward();
  float *delta = rows.delta, *dq = rows.dq;

  // This rank's block's gradients are kept in fp32 only in `kept`: the columns other members reach
  // (their shares arrive and are added in) and those several own calls reach. Every other column
  // has one call, which writes it in the problem dtype straight into dK and dV, as at world size 1.
  const std::vector<BlockCall> own = plan_(rank_, rank_);
  const Interval mine = carried(1, rank_), kept = kept_columns(own, mine);
  if (kept.size() > s.kept_columns)
    attnhost::fail(ATTNHOST_ERR_INTERNAL, "schedule: a rank keeps more columns than its shape was sized for");
  // Where one member's share is all that arrives (a window reaches one block back) and each column of
  // the own block has one call (zigzag's two chunks: two), the kept columns need no fp32 sum: each
  // call's piece over them runs last and adds the share as it writes them (BackwardParams::dk_add), so
  // no clearing, adds or rounding pass; the bulk runs before, under the share's way home
  // (docs/KERNELS.md, "Windows: only the keys a window reaches").
  int sharing = 0, share_step = 0;
  for (int step = 1; step < world_; ++step)
    if (reached(step, rank_).size() > 0) ++sharing, share_step = step;
  bool one_call_a_column = true;
  for (size_t i = 0; i < own.size(); ++i) {
    one_call_a_column = one_call_a_column && dense(own[i]);
    for (size_t j = i + 1; j < own.size(); ++j)
      one_call_a_column = one_call_a_column && (own[i].kv_end <= own[j].kv_begin || own[j].kv_end <= own[i].kv_begin);
  }
  const bool add_as_written = sharing == 1 && one_call_a_column && kept.lo == mine.lo && kept.hi == mine.hi;
  // The sums of the kept columns; what this rank computes of another's block, two pairs alternating
  // with their messages; what arrives of its own (layout).
  const KV sum = w.kept, computed[2] = {w.grads[0], w.grads[1]}, arriving = w.grads[2];
  // A compact fp32 view of columns `cols` of a block, from column `col`.
  const auto compact = [&](void* base, Interval cols, int64_t col) {
    return view({base, cols.size(), cols.lo, ATTNHOST_DTYPE_FP32}, col, s);
  };
  const auto run = [&](const BlockCall& c, const KV& cur, int step, const std::function<void(BackwardParams&)>& out) {
    if (c.backward_segments && c.num_backward_segments == 0) return;  // nothing attends: nothing to differentiate
    const std::string name = "attention backward step " + std::to_string(step);
    const int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMPUTE, compute);
    BackwardParams p = backward_params(s, c, a, cur.k, cur.v, delta, dq, static_cast<float*>(sum.k), static_cast<float*>(sum.v));
    p.k = view(held(step, source(step), cur.k), c.kv_begin, s);
    p.v = view(held(step, source(step), cur.v), c.kv_begin, s);
    out(p);
    engine_->backward(p, compute);
    host_.range_end(range, compute);
  };
  // The own block's calls cut at kept's ends: the pieces inside add into `sum` (or write, adding the
  // share that came home), the others write.
  // (Cutting the others in two, half under the first hop, half under the last gradients home, was
  // slower: docs/KERNELS.md, "Windows: only the keys a window reaches".)
  const auto own_pieces = [&](bool inside) {
    const KV mine_kv{a.k.data, a.v.data};
    for (const BlockCall& c : own) {
      if (!dense(c)) {
        if (inside) run(c, mine_kv, 0, [&](BackwardParams& p) {
            p.dk = compact(sum.k, kept, c.kv_begin);
            p.dv = compact(sum.v, kept, c.kv_begin);
          });
        continue;
      }
      const int64_t cuts[] = {c.kv_begin, std::clamp(kept.lo, c.kv_begin, c.kv_end), std::clamp(kept.hi, c.kv_begin, c.kv_end), c.kv_end};
      for (int k = 0; k < 3; ++k) {
        if (cuts[k + 1] <= cuts[k] || (k == 1) != inside) continue;
        BlockCall piece = c;
        piece.kv_begin = cuts[k];
        piece.kv_end = cuts[k + 1];
        piece.kv_pos0 = c.kv_pos0 + (piece.kv_begin - c.kv_begin);
        run(piece, mine_kv, 0, [&](BackwardParams& p) {
          if (inside && add_as_written) {
            const Interval in = reached(share_step, rank_);
            write_dkdv_into(p, s, piece, a);
            p.dk_add = compact(arriving.k, mine, piece.kv_begin);
            p.dv_add = compact(arriving.v, mine, piece.kv_begin);
            p.add_begin = std::max(in.lo, piece.kv_begin) - piece.kv_begin;
            p.add_end = std::min(in.hi, piece.kv_end) - piece.kv_begin;
          } else if (inside) {
            p.dk = compact(sum.k, kept, piece.kv_begin);
            p.dv = compact(sum.v, kept, piece.kv_begin);
          } else {
            write_dkdv_into(p, s, piece, a);
          }
        });
      }
    }
  };

  bool passed = kept_hop.made;
  Engine::Event kv_ready = kept_hop.arrived;
  if (!kept_hop.made) {
    engine_->wait(comm, compute);  // the inputs are ready
    passed = pass_kv(s, {a.k.data, a.v.data}, w.receive[1], 0, comm);  // under delta and the first own pieces
    kv_ready = engine_->record(comm);
  }
  engine_->wait(compute, prologue);
  if (kept.size() > 0 && !add_as_written) {
    engine_->zero(sum.k, size_t(s.batch) * kept.size() * token * 4, compute);
    engine_->zero(sum.v, size_t(s.batch) * kept.size() * token * 4, compute);
    own_pieces(true);  // under the first hop
  }

  Engine::Event sent[2];  // computed[i] has gone home
  for (int step = 1; step < world_; ++step) {
    if (passed) engine_->wait(compute, kv_ready);  // this step's block has arrived
    const KV cur = w.receive[step % 2];
    const Engine::Event read = engine_->record(compute);  // the previous step has read its block
    const std::vector<BlockCall> calls = plan_(rank_, source(step));
    const Interval cols = carried(1, source(step));  // the columns `grad` holds
    const KV grad = computed[step % 2];
    // One dense call writes its columns (the only ones that go home) rather than adding into zeros.
    const bool writes = calls.size() == 1 && dense(calls[0]) && !dtype_partials_;
    if (step >= 3) engine_->wait(compute, sent[step % 2]);
    if (!calls.empty() && !writes) {
      engine_->zero(grad.k, size_t(s.batch) * cols.size() * token * 4, compute);
      engine_->zero(grad.v, size_t(s.batch) * cols.size() * token * 4, compute);
    }
    for (const BlockCall& c : calls)
      run(c, cur, step, [&](BackwardParams& p) {
        p.dk = compact(grad.k, cols, c.kv_begin);
        p.dv = compact(grad.v, cols, c.kv_begin);
        p.write_dkdv = p.write_dkdv_fp32 = writes;
      });
    passed = false;
    if (step + 1 < world_) {  // (after the step's kernels, as in the forward)
      engine_->wait(comm, read);  // the receive buffer was read by the previous step
      passed = pass_kv(s, cur, w.receive[(step + 1) % 2], step, comm);
      kv_ready = engine_->record(comm);
    }
    // What this rank computed of the block in hand goes to its owner; what the member holding this
    // rank's block computed of it arrives and is added in.
    const Interval out = reached(step, source(step)), in = reached(step, rank_);
    if (out.size() == 0 && in.size() == 0) continue;
    engine_->wait(comm, compute);
    const std::string name = "dK dV home step " + std::to_string(step);
    const int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMMUNICATION, comm);
    host_.group_start();
    // (Both ends lay a block's columns out alike: carried(1, block).)
    for (void* g : {grad.k, grad.v}) {
      const Columns b{g, cols.size(), cols.lo, ATTNHOST_DTYPE_FP32};
      transfer(true, b, b, out, source(step), s, comm);
    }
    for (void* g : {arriving.k, arriving.v}) {
      const Columns b{g, mine.size(), mine.lo, ATTNHOST_DTYPE_FP32};
      transfer(false, b, b, in, member_at(step), s, comm);
    }
    host_.group_end();
    sent[step % 2] = engine_->record(comm);
    for (auto [total, share] : {std::pair{sum.k, arriving.k}, std::pair{sum.v, arriving.v}})
      for (int32_t b = 0; b < s.batch && in.size() > 0 && !add_as_written; ++b)
        engine_->add(static_cast<float*>(total) + (b * kept.size() + in.lo - kept.lo) * token,
                     static_cast<const float*>(share) + (b * mine.size() + in.lo - mine.lo) * token,
                     in.size() * token, comm);
    host_.range_end(range, comm);
  }
  own_pieces(false);  // the bulk, under the last gradients home
  engine_->wait(compute, comm);  // every share of this rank's block is in
  if (add_as_written) return own_pieces(true);
  if (kept.size() > 0)
    for (auto [total, out] : {std::pair{sum.k, a.dk.data}, std::pair{sum.v, a.dv.data}}) {
      if (s.kv_grads_fp32) {
        const size_t row = size_t(kept.size()) * token * 4;
        engine_->copy_rows(static_cast<char*>(out) + kept.lo * token * 4, size_t(s.local_kv) * token * 4, total, row, row,
                           s.batch, compute);
        continue;
      }
      ConvertParams cv;
      cv.dtype = core_dtype(output_dtype(s));
      cv.batch = s.batch;
      cv.heads = s.heads_kv;
      cv.head_dim = s.head_dim;
      cv.seqlen = kept.size();
      cv.src = compact(total, kept, kept.lo);
      cv.dst = LocalViews{s}.kv(out, kept.lo, Elem::output);
      engine_->convert(cv, compute);
    }
}

void RingAttention::zero_outside(const RingShape& s, const KV& grad, int64_t begin, int64_t end, void* stream) {
  const size_t token = size_t(s.heads_kv) * s.head_dim * 4;
  for (void* t : {grad.k, grad.v})
    for (int32_t b = 0; b < s.batch; ++b) {
      char* entry = static_cast<char*>(t) + size_t(b) * s.local_kv * token;
      if (begin > 0) engine_->zero(entry, size_t(begin) * token, stream);
      if (end < s.local_kv) engine_->zero(entry + size_t(end) * token, size_t(s.local_kv - end) * token, stream);
    }
}

void RingAttention::finish_kv_grad(const RingShape& s, const float* grad, void* out, void* stream) {
  if (!s.kv_grads_fp32) return convert_out(s, *engine_, grad, out, true, stream);
  const size_t bytes = local_sizes(s).kv * 4;
  engine_->copy_rows(out, bytes, grad, bytes, bytes, 1, stream);
}

int64_t call_pairs(const RingShape& s, const BlockCall& c) {
  if (c.pairs >= 0) return c.pairs;
  if (!c.masked) return (c.q_end - c.q_begin) * (c.kv_end - c.kv_begin);
  return s.mask.pairs(c.q_pos0, c.q_pos0 + (c.q_end - c.q_begin), c.kv_pos0, c.kv_pos0 + (c.kv_end - c.kv_begin));
}

int64_t RingAttention::rank_pairs() const {
  int64_t pairs = 0;
  for (int step = 0; step < world_; ++step)
    for (const BlockCall& c : plan_(rank_, source(step))) pairs += call_pairs(s_, c);
  return pairs * s_.batch * s_.heads_q;
}

}  // namespace attncore::plugin
