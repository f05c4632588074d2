#include "attncore/plugin/ulysses.h"

#include "attncore/plugin/blocks.h"
#include "calls.h"

#include <algorithm>
#include <utility>

namespace attncore::plugin {

namespace {

// Automatic: the forward always tapered; the backward where one batch entry's call over a head
// group holds at least 1024 query tiles of 128 rows (8 waves on 132 SMs). At 1024 and 1536 a call of
// one entry kept the rate of the group's call of four; at 384 (6 heads, 8192 rows) the backward's
// lost more than the exchange it hid, the forward's less (docs/KERNELS.md, "Tapered pipeline").
bool tapered(Taper taper, bool forward, int32_t heads_per_group, int64_t rows) {
  if (taper != Taper::automatic) return taper == Taper::on;
  return forward || int64_t{heads_per_group} * ((rows + 127) / 128) >= 1024;
}

// The pipeline's steps, group after group: each group whole, or, tapered, with the first group's
// first batch entry and the last group's last one steps of their own. The exchange before the first
// call and the one after the last then move one entry's heads, and the next step's exchange still
// has a call to run under.
std::vector<UlyssesAttention::Step> pipeline_steps(int32_t groups, int32_t batch, bool taper) {
  std::vector<UlyssesAttention::Step> steps;
  const bool cut = taper && batch > 1;
  for (int32_t g = 0; g < groups; ++g) {
    int32_t b0 = 0, end = batch;
    if (cut && g == 0) steps.push_back({g, b0++, 1});
    const bool last_alone = cut && g == groups - 1 && end - b0 > 1;
    if (last_alone) --end;
    if (end > b0) steps.push_back({g, b0, end - b0});
    if (last_alone) steps.push_back({g, end, 1});
  }
  return steps;
}

}  // namespace

// A group's call of one batch entry holds at least this many attended pairs for auto to take two
// groups: its calls must be long against what a boundary between groups costs (docs/KERNELS.md,
// "Head-group pipeline"). On two H200s one group was 2.3% faster at 6 x 2^25 pairs (medium) and 2.5%
// at 8 x 2^23 (a 512-key window over 16384 tokens); two were level or 0.3-0.8% faster at 8 x 2^27
// (large). Never more than two: a call over fewer heads lost more than the exchange it hid saved, at
// 12 and 16 heads a rank.
constexpr int64_t kPairsForTwoGroups = int64_t{1} << 29;

int32_t ulysses_head_groups(int32_t asked, int32_t heads, int32_t kv_heads, int32_t u, int64_t pairs) {
  if (u == 1) return 1;
  if (asked > 0) return kv_heads % asked == 0 ? asked : 1;
  return kv_heads % 2 == 0 && heads / 2 * pairs >= kPairsForTwoGroups ? 2 : 1;
}

std::string check_ulysses_heads(int32_t heads_q, int32_t heads_kv, int32_t u) {
  if (heads_q % u != 0)
    return std::to_string(heads_q) + " query heads do not divide among " + std::to_string(u) +
           " ranks of a Ulysses group (heads_q must be a multiple of the group size)";
  if (heads_kv % u != 0 && u % heads_kv != 0)
    return std::to_string(heads_kv) + " kv heads cannot be cut among " + std::to_string(u) +
           " ranks of a Ulysses group, nor replicated evenly (one must divide the other)";
  return {};
}

// Two members, causal: member 0 runs member 1's columns first (their dK and dV go home under the
// rest) and keeps dQ of member 1's rows, which read every key, for the end; member 1 runs member 0's
// columns first, which finishes all of member 0's gradients, and its own last.
ColumnRunOrder column_run_order(const DenseMask& mask, int64_t n, int u, int member, int32_t heads_q,
                                int32_t heads_kv) {
  std::vector<Interval> reach(u);  // whose columns member i's rows reach: members [lo, hi)
  for (int i = 0; i < u; ++i) {
    const Interval keys = mask.visible(i * n, (i + 1) * n, 0, u * n).keys;
    if (keys.size() > 0) reach[i] = {keys.lo / n, (keys.hi - 1) / n + 1};
  }
  std::vector<bool> ran(u, false), final(u, false);
  const auto finished = [&](int i) {
    for (int64_t j = reach[i].lo; j < reach[i].hi; ++j)
      if (!ran[j]) return false;
    return true;
  };
  ColumnRunOrder order;
  for (int t = 0; t < u; ++t) {
    int best = -1;
    int64_t most = -1;
    for (int j = 0; j < u; ++j) {
      if (ran[j]) continue;
      ran[j] = true;
      int64_t heads = j == member ? 0 : 2 * int64_t{heads_kv};
      for (int i = 0; i < u; ++i)
        if (i != member && !final[i] && finished(i)) heads += heads_q;
      ran[j] = false;
      if (heads > most) best = j, most = heads;
    }
    ran[best] = true;
    order.members.push_back(best);
    order.final_rows.emplace_back();
    for (int i = 0; i < u; ++i)
      if (!final[i] && finished(i)) {
        final[i] = true;
        order.final_rows.back().push_back(i);
      }
  }
  return order;
}

UlyssesAttention::UlyssesAttention(const UlyssesShape& shape, RingPlan plan, const ScheduleOptions& options)
    : s_(shape), host_(options.host), u_(shape.ulysses), member_(options.rank % shape.ulysses),
      base_(options.rank - options.rank % shape.ulysses), n_(shape.ring.local_q), overlap_(options.overlap),
      direct_(!shape.packed && host_.blocks()), engine_(Engine::make(options.cuda, options.cpu_fp64)) {
  const RingShape& r = s_.ring;
  heads_ = r.heads_q / u_;
  kv_heads_ = kv_heads_replicated(r.heads_kv, u_) ? 1 : r.heads_kv / u_;
  const RingMembers members{options.rank / u_, options.world_size / u_, member_, u_};
  int64_t pairs = 0;  // a query head's in one batch entry, over every block of the ring
  for (int source = 0; source < members.size; ++source)
    for (const BlockCall& c : plan(members.position, source)) pairs += call_pairs(r, c);
  groups_ = ulysses_head_groups(s_.head_groups, heads_, kv_heads_, u_, pairs);
  group_shape_ = r;
  group_shape_.heads_q = heads_ / groups_;
  group_shape_.heads_kv = kv_heads_ / groups_;
  group_shape_.local_q = group_shape_.local_kv = u_ * n_;
  group_shape_.batch_slices = group_shape_.head_slices = 1;
  group_shape_.kv_grads_fp32 = kv_heads_replicated(r.heads_kv, u_);
  steps_ = pipeline_steps(groups_, r.batch, tapered(s_.taper, false, group_shape_.heads_q, group_shape_.local_q));
  ring_ = std::make_unique<RingAttention>(group_shape_, std::move(plan), options, members);
  if (u_ == 1) return;  // the ring runs on the problem's own tensors
  work_ = Workspace<Buffers>(host_, [&](Carver& c, Pass) { return layout(c); });
  if (kv_heads_replicated(r.heads_kv, u_) && options.rank == 0)
    host_.log(ATTNHOST_LOG_WARNING, "each of the " + std::to_string(r.heads_kv) + " kv heads is replicated on " +
                                        std::to_string(u_ / r.heads_kv) + " ranks of a Ulysses group of " +
                                        std::to_string(u_) + " (fewer kv heads than ranks); their gradients are summed in fp32");
}

UlyssesAttention::~UlyssesAttention() = default;

std::vector<UlyssesAttention::Step> UlyssesAttention::forward_steps() const {
  return pipeline_steps(groups_, s_.ring.batch, tapered(s_.taper, true, group_shape_.heads_q, group_shape_.local_q));
}

UlyssesAttention::Buffers UlyssesAttention::layout(Carver& c) const {
  const RingShape& r = s_.ring;
  const size_t in_el = elem_size(r, Elem::input), out_el = elem_size(r, Elem::output);
  const LocalSizes g = local_sizes(group_shape_);  // one group's head-sharded tensors
  // The largest message (a backward that exchanges Q, O, dO, K, V and LSE; fp32 kv gradients), out
  // and in, for every member.
  const size_t message = static_cast<size_t>(r.batch) * n_ * r.head_dim *
                             (3 * group_shape_.heads_q * out_el + 2 * group_shape_.heads_kv * 4) +
                         static_cast<size_t>(r.batch) * group_shape_.heads_q * n_ * 4 + 6 * 256;
  const size_t dkv_el = group_shape_.kv_grads_fp32 ? 4 : out_el;
  Buffers b;
  for (char** t : {&b.q, &b.d_o}) *t = c.take(groups_ * g.q * in_el);
  for (char** t : {&b.o, &b.dq}) *t = c.take(groups_ * g.q * out_el);
  for (char** t : {&b.k, &b.v}) *t = c.take(groups_ * g.kv * in_el);
  for (char** t : {&b.dk, &b.dv}) *t = c.take(groups_ * g.kv * dkv_el);
  b.lse = c.take(groups_ * g.rows * 4);
  // The packed messages out and in, or (blocks as they lie) the replicated kv heads' sums coming in.
  if (!direct_ || kv_heads_replicated(r.heads_kv, u_)) b.staging = c.take((direct_ ? 1 : 2) * u_ * message);
  if (kv_heads_replicated(r.heads_kv, u_)) {
    const size_t sum_elems = static_cast<size_t>(r.batch) * n_ * r.heads_kv * r.head_dim;
    b.dk_sum = c.take<float>(sum_elems * 4);
    b.dv_sum = c.take<float>(sum_elems * 4);
  }
  return b;
}

int32_t UlyssesAttention::first_head(int member, const Piece& p, int32_t group) const {
  if (!p.kv) return member * heads_ + group * p.count;
  if (kv_heads_replicated(s_.ring.heads_kv, u_)) return member * heads_ / (s_.ring.heads_q / s_.ring.heads_kv);
  return member * kv_heads_ + group * p.count;
}

size_t UlyssesAttention::piece_elem(const Piece& p) const {
  return p.sum ? 4 : elem_size(s_.ring, p.output ? Elem::output : Elem::input);
}

attnhost_tensor UlyssesAttention::sharded(void* data, bool kv, int32_t dtype) const {
  const RingShape& g = group_shape_;
  const int64_t heads = kv ? g.heads_kv : g.heads_q;
  attnhost_tensor t{};
  t.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_tensor, strides);
  t.data = data;
  t.dtype = dtype;
  t.ndim = 4;
  const int64_t shape[4] = {g.batch, g.local_q, heads, g.head_dim};
  const int64_t strides[4] = {g.local_q * heads * g.head_dim, heads * g.head_dim, g.head_dim, 1};
  std::copy(shape, shape + 4, t.shape);
  std::copy(strides, strides + 4, t.strides);
  return t;
}

void UlyssesAttention::kept_tensors(int group, attnhost_tensor& q, attnhost_tensor& k, attnhost_tensor& v,
                                    attnhost_tensor& o, attnhost_tensor& lse) const {
  const LocalSizes g = local_sizes(group_shape_);
  const RingShape& r = s_.ring;
  const size_t el = elem_size(r, Elem::input), out_el = elem_size(r, Elem::output);
  const Buffers& b = buffers();
  q = sharded(b.q + group * g.q * el, false, r.dtype);
  k = sharded(b.k + group * g.kv * el, true, r.dtype);
  v = sharded(b.v + group * g.kv * el, true, r.dtype);
  o = sharded(b.o + group * g.q * out_el, false, output_dtype(r));
  lse = stats(b.lse + group * g.rows * 4);
}

attnhost_tensor UlyssesAttention::stats(void* data) const {
  const RingShape& g = group_shape_;
  attnhost_tensor t{};
  t.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_tensor, strides);
  t.data = data;
  t.dtype = ATTNHOST_DTYPE_FP32;
  t.ndim = 3;
  const int64_t shape[3] = {g.batch, g.heads_q, g.local_q};
  const int64_t strides[3] = {g.heads_q * g.local_q, g.local_q, 1};
  std::copy(shape, shape + 3, t.shape);
  std::copy(strides, strides + 3, t.strides);
  return t;
}

void UlyssesAttention::to_heads(const std::vector<Piece>& pieces, const Step& step, void* stream, void* own,
                                const std::string& what) {
  exchange(pieces, true, step, stream, own, what, {});
}

void UlyssesAttention::to_tokens(const std::vector<Piece>& pieces, const Step& step, void* stream, void* own,
                                 const std::string& what, const Moves& moves) {
  exchange(pieces, false, step, stream, own, what, moves);
}

// One all-to-all inside the Ulysses group. Each (piece, peer) is a block on each side: the rows of
// my tensor that go to the peer, and the rows of my other tensor that come from it. Where the host
// moves blocks as they lie (GPUs that reach one another's memory, the CPU), each is one copy by the
// copy engines and no kernel packs anything: between two H200s a 3-D peer copy of 1536-byte rows ran
// at 376 GB/s under compute, the copy kernel and a contiguous copy at 165 (docs/KERNELS.md, "Blocks
// as they lie"). Elsewhere (NCCL's kernels, MPI) the blocks for a peer are packed side by side into
// one message each way by the copy kernel: many small NCCL messages moved 2-3x slower over NVLink
// (docs/KERNELS.md, "All-to-all messages"). The member's own heads are copied on `own`.
void UlyssesAttention::exchange(const std::vector<Piece>& whole, bool heads_out, const Step& step, void* stream,
                                void* own, const std::string& what, const Moves& moves) {
  const RingShape& r = s_.ring;
  const size_t D = r.head_dim, B = step.count, n = n_, un = u_ * n_;
  std::vector<Piece> pieces = whole;
  for (Piece& p : pieces) {  // from the step's first entry: [B, n, heads, .] local, [B, u*n, count, .] sharded
    const size_t unit = p.tokens ? D * piece_elem(p) : 4;  // row statistics: [B, heads, n], [B, count, u*n]
    p.local = static_cast<char*>(p.local) + step.b0 * n * p.heads * unit;
    p.sharded = static_cast<char*>(p.sharded) + step.b0 * un * p.count * unit;
  }
  // Piece p's rows for member i in the local tensor (its heads, my tokens) and in the sharded one
  // (my heads, its tokens).
  const auto local_rows = [&](const Piece& p, int i) {
    const size_t c = p.count, h0 = first_head(i, p, step.group);
    if (!p.tokens) return make_block(static_cast<char*>(p.local) + h0 * n * 4, n * 4, c, n * 4, B, p.heads * n * 4);
    const size_t el = piece_elem(p), row = c * D * el, lrow = p.heads * D * el;
    return make_block(static_cast<char*>(p.local) + h0 * D * el, row, n, lrow, B, n * lrow);
  };
  const auto sharded_rows = [&](const Piece& p, int i) {
    const size_t c = p.count;
    if (!p.tokens) return make_block(static_cast<char*>(p.sharded) + i * n * 4, n * 4, c, un * 4, B, c * un * 4);
    const size_t row = c * D * piece_elem(p);
    return make_block(static_cast<char*>(p.sharded) + i * n * row, row, n, row, B, un * row);
  };
  struct Sum {
    float* dst;
    const float* src;
    size_t count;
  };
  std::vector<Sum> sums;
  std::vector<std::pair<attnhost_block, attnhost_block>> before, after, mine;  // (dst, src) copies
  std::vector<std::vector<attnhost_block>> out(u_), in(u_);                    // by peer, in piece order
  // The packed messages: a peer's pieces side by side, laid out alike at both ends since every
  // member's pieces have the same sizes; the replicated kv heads' fp32 sums always arrive there.
  size_t message = 0;
  for (const Piece& p : pieces) message += align_up(block_bytes(local_rows(p, 0)));
  char* staging = buffers().staging;
  const auto outgoing = [&](int i) { return staging + size_t(i) * 2 * message; };  // (packed only)
  const auto incoming = [&](int i) { return staging + (direct_ ? size_t(i) : size_t(i) * 2 + 1) * message; };
  size_t offset = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& p = pieces[k];
    for (int i = 0; i < u_; ++i) {
      const attnhost_block here = heads_out ? local_rows(p, i) : sharded_rows(p, i);   // goes to i
      attnhost_block there = heads_out ? sharded_rows(p, i) : local_rows(p, i);        // comes from i
      if (p.sum) {  // i's fp32 gradients of my tokens (one kv head), added into the sums [B, Hkv, n, D]
        const size_t c = p.count, row = c * D * 4, h0 = first_head(i, p, step.group);
        const char* from = i == member_ ? static_cast<char*>(here.data) : incoming(i) + offset;
        if (i != member_) there = packed_like(incoming(i) + offset, here);
        for (size_t b = 0; b < B; ++b)
          sums.push_back({reinterpret_cast<float*>(static_cast<char*>(p.local) + (b * p.heads + h0) * n * row),
                          reinterpret_cast<const float*>(from + b * (i == member_ ? un : n) * row), n * c * D});
        if (i == member_) continue;
      } else if (i == member_) {
        if (!moves.which || moves.which(k, i, true)) mine.push_back({there, here});
        continue;
      }
      if (direct_) {
        if (!moves.which || moves.which(k, i, true)) out[i].push_back(here);
        if (!moves.which || moves.which(k, i, false)) in[i].push_back(there);
        continue;
      }
      before.push_back({packed_like(outgoing(i) + offset, here), here});
      if (!p.sum) after.push_back({there, packed_like(incoming(i) + offset, there)});
    }
    offset += align_up(block_bytes(local_rows(p, 0)));
  }
  const std::string name = what + " group " + std::to_string(step.group) + " entries " +
                           std::to_string(step.b0) + "-" + std::to_string(step.b0 + step.count - 1);
  const int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMMUNICATION, stream);
  for (const auto& [dst, src] : before) copy_block(*engine_, dst, src, stream);
  host_.group_start();
  for (int i = 0; i < u_; ++i) {
    if (i == member_) continue;
    if (!direct_) {
      host_.send(outgoing(i), message, ATTNHOST_DTYPE_UINT8, base_ + i, stream);
      host_.recv(incoming(i), message, ATTNHOST_DTYPE_UINT8, base_ + i, stream);
      continue;
    }
    for (const attnhost_block& b : out[i]) host_.send_block(b, base_ + i, stream);
    for (const attnhost_block& b : in[i]) host_.recv_block(b, base_ + i, moves.receive ? moves.receive : stream);
  }
  host_.group_end();
  // The own heads after the messages: the group is where the host meets the peers, and a pass's
  // first call waits for both (docs/KERNELS.md, "The host's order at a pass's start").
  for (const auto& [dst, src] : mine) copy_block(*engine_, dst, src, own);
  for (const auto& [dst, src] : after) copy_block(*engine_, dst, src, stream);
  for (const Sum& m : sums) engine_->add(m.dst, m.src, m.count, stream);
  host_.range_end(range, stream);
}

void UlyssesAttention::forward(const attnhost_forward_args& a) {
  if (u_ == 1) return ring_->forward(a);
  const LocalSizes g = local_sizes(group_shape_);
  const size_t el = elem_size(s_.ring, Elem::input);
  void* compute = host_.stream(0);
  void* xs = overlap_ ? host_.stream(2) : compute;
  // The first step's own heads are copied on the compute stream, which waits for its exchange, and
  // the last step's, after its call (docs/KERNELS.md, "Head-group pipeline").
  const auto own = [&](size_t k, size_t edge) { return k == edge ? compute : xs; };
  const Buffers& b = buffers();
  const auto at = [&](char* base, size_t elems, int group, size_t bytes) { return base + group * elems * bytes; };
  const std::vector<Step> steps = forward_steps();
  std::vector<Engine::Event> arrived(steps.size());
  const auto bring = [&](size_t k) {
    const int group = steps[k].group;
    to_heads({{a.q.data, at(b.q, g.q, group, el), s_.ring.heads_q, group_shape_.heads_q, false},
              {a.k.data, at(b.k, g.kv, group, el), s_.ring.heads_kv, group_shape_.heads_kv, true},
              {a.v.data, at(b.v, g.kv, group, el), s_.ring.heads_kv, group_shape_.heads_kv, true}},
             steps[k], xs, own(k, 0), "Q K V to heads");
    arrived[k] = engine_->record(xs);
  };
  engine_->wait(xs, compute);  // the inputs are ready
  bring(0);
  for (size_t k = 0; k < steps.size(); ++k) {
    const Step& step = steps[k];
    engine_->wait(compute, arrived[k]);
    attnhost_forward_args x = a;
    kept_tensors(step.group, x.q, x.k, x.v, x.o, x.lse);
    ring_->forward(x, step.b0, step.count);
    if (k + 1 < steps.size()) bring(k + 1);  // (after the call is queued: the host meets the peer here)
    engine_->wait(xs, compute);
    to_tokens({{a.o.data, x.o.data, s_.ring.heads_q, group_shape_.heads_q, false, true, false, true},
               {a.lse.data, x.lse.data, s_.ring.heads_q, group_shape_.heads_q, false, false}},
              step, xs, own(k, steps.size() - 1), "O LSE to tokens", {});
  }
  engine_->wait(compute, xs);
  report_amax(*engine_, s_.ring, a, compute);  // O is home, in sequence sharding
  const void* given[5] = {a.q.data, a.k.data, a.v.data, a.o.data, a.lse.data};
  std::copy_n(given, 5, kept_);
}

void UlyssesAttention::backward(const attnhost_backward_args& a) {
  if (u_ == 1) return ring_->backward(a);
  const RingShape& r = s_.ring;
  const LocalSizes g = local_sizes(group_shape_);
  const size_t el = elem_size(r, Elem::input), out_el = elem_size(r, Elem::output);
  void* compute = host_.stream(0);
  void* xs = overlap_ ? host_.stream(2) : compute;
  // Where blocks go as they lie in a ring of one, the own heads of the gradients of a step before the
  // last are copied on the ring's transfer stream (idle there, at the greatest priority) rather than
  // after the step's messages on the exchange stream: so they run as the call ends, before the last
  // step's first run takes that stream (docs/KERNELS.md, "Ulysses's last step in runs of columns").
  void* mine = overlap_ && direct_ && ring_->members() == 1 ? host_.stream(1) : xs;
  const auto own_in = [&](size_t k) { return k == 0 ? compute : xs; };  // as in the forward
  const auto own_out = [&](size_t k) { return k + 1 == steps_.size() ? compute : mine; };
  const auto at = [&](char* base, size_t elems, int group, size_t bytes) { return base + group * elems * bytes; };
  const void* given[5] = {a.q.data, a.k.data, a.v.data, a.o.data, a.lse.data};
  const bool kept = std::equal(given, given + 5, kept_);
  const bool replicated = kv_heads_replicated(r.heads_kv, u_);
  const size_t sum_elems = static_cast<size_t>(r.batch) * n_ * r.heads_kv * r.head_dim;
  const Buffers& b = buffers();
  float *dk_sum = b.dk_sum, *dv_sum = b.dv_sum;
  const std::vector<Step>& steps = steps_;
  std::vector<Engine::Event> arrived(steps.size());
  const auto bring = [&](size_t k) {
    const int group = steps[k].group;
    std::vector<Piece> in = {{a.d_o.data, at(b.d_o, g.q, group, el), r.heads_q, group_shape_.heads_q, false}};
    if (!kept) {
      in.push_back({a.q.data, at(b.q, g.q, group, el), r.heads_q, group_shape_.heads_q, false});
      in.push_back({a.o.data, at(b.o, g.q, group, out_el), r.heads_q, group_shape_.heads_q, false, true, false, true});
      in.push_back({a.k.data, at(b.k, g.kv, group, el), r.heads_kv, group_shape_.heads_kv, true});
      in.push_back({a.v.data, at(b.v, g.kv, group, el), r.heads_kv, group_shape_.heads_kv, true});
      in.push_back({a.lse.data, at(b.lse, g.rows, group, 4), r.heads_q, group_shape_.heads_q, false, false});
    }
    to_heads(in, steps[k], xs, own_in(k), kept ? "dO to heads" : "Q K V O dO LSE to heads");
    arrived[k] = engine_->record(xs);
  };
  engine_->wait(xs, compute);
  if (replicated) {
    engine_->zero(dk_sum, sum_elems * 4, xs);
    engine_->zero(dv_sum, sum_elems * 4, xs);
  }
  bring(0);
  // The first step's own tokens are copied on the compute stream (own_in), so their delta and dQ's
  // clearing need not wait for the peers' (docs/KERNELS.md, "Ulysses's backward: its edges").
  const Engine::Event own_first = engine_->record(compute);
  for (size_t k = 0; k < steps.size(); ++k) {
    const Step& step = steps[k];
    const int group = step.group;
    engine_->wait(compute, arrived[k]);
    attnhost_backward_args x = a;
    kept_tensors(group, x.q, x.k, x.v, x.o, x.lse);
    x.d_o = sharded(at(b.d_o, g.q, group, el), false, d_o_dtype(r, a));
    x.dq = sharded(at(b.dq, g.q, group, out_el), false, output_dtype(r));
    const size_t dkv_el = replicated ? 4 : out_el;
    const int32_t dkv_type = replicated ? ATTNHOST_DTYPE_FP32 : output_dtype(r);
    x.dk = sharded(at(b.dk, g.kv, group, dkv_el), true, dkv_type);
    x.dv = sharded(at(b.dv, g.kv, group, dkv_el), true, dkv_type);
    Piece dq{a.dq.data, x.dq.data, r.heads_q, group_shape_.heads_q, false, true, false, true};
    Piece dk{a.dk.data, x.dk.data, r.heads_kv, group_shape_.heads_kv, true, true, false, true};
    Piece dv{a.dv.data, x.dv.data, r.heads_kv, group_shape_.heads_kv, true, true, false, true};
    if (k + 1 == steps.size() && direct_ && !replicated && ring_->takes_runs()) {
      backward_last_in_runs(a, x, step, {dq, dk, dv}, xs, k == 0 ? &own_first : nullptr);
      break;
    }
    const Engine::Event rounded = ring_->backward(x, step.b0, step.count);  // dQ, on the ring's fill stream
    const Engine::Event written = engine_->record(compute);                  // dK and dV, by the call itself
    engine_->wait(compute, rounded);
    if (k + 1 < steps.size()) bring(k + 1);  // (after the call is queued, as in the forward)
    if (replicated) {
      dk.local = dk_sum;
      dv.local = dv_sum;
      dk.sum = dv.sum = true;
    }
    // Where blocks go as they lie, dK and dV leave as the call ends and dQ once rounded, so after the
    // last call the rounding is not in the way (docs/KERNELS.md, "Ulysses's backward"); packed, one
    // message a peer carries all three.
    if (direct_) {
      for (void* st : {xs, mine}) engine_->wait(st, written);
      to_tokens({dk, dv}, step, xs, own_out(k), "dK dV to tokens", {});
      for (void* st : {xs, mine}) engine_->wait(st, rounded);
      to_tokens({dq}, step, xs, own_out(k), "dQ to tokens", {});
    } else {
      engine_->wait(xs, compute);
      to_tokens({dq, dk, dv}, step, xs, own_out(k), "dQ dK dV to tokens", {});
    }
  }
  if (replicated)
    for (auto [sum, out] : {std::pair{dk_sum, a.dk.data}, std::pair{dv_sum, a.dv.data}}) {
      ConvertParams cv;  // [B, Hkv, n, D] sums into [B, n, Hkv, D]
      cv.dtype = core_dtype(output_dtype(r));
      cv.batch = r.batch;
      cv.heads = r.heads_kv;
      cv.head_dim = r.head_dim;
      cv.seqlen = n_;
      cv.src = {sum, r.heads_kv * n_ * r.head_dim, r.head_dim, n_ * r.head_dim};
      cv.dst = {out, n_ * r.heads_kv * r.head_dim, int64_t{r.heads_kv} * r.head_dim, r.head_dim};
      engine_->convert(cv, xs);
    }
  engine_->wait(compute, mine);
  engine_->wait(compute, xs);
  report_amax(*engine_, r, a, compute);  // the gradients are home
  std::copy_n(given, 5, kept_);
}

// The pieces are dQ, dK and dV, in that order. Every member knows every member's order, so at
// round t each sends what its run t finished and receives what its peers' runs t finished. The
// member's own heads are written straight into its outputs (no copy between layouts after the
// last run). dQ's rows are rounded on the exchange stream, at the greatest priority, so that they
// do not wait for the next run's blocks to leave SMs. The receives go on a stream of their own (the
// ring's transfer stream, idle in a ring of one, at the greatest priority too; where the runs go
// side by side, after the first run, which it then also takes): they write only the outputs, and on
// the exchange stream they would let no peer copy in before this member's run t had ended.
void UlyssesAttention::backward_last_in_runs(const attnhost_backward_args& a, const attnhost_backward_args& x,
                                             const Step& step, const std::vector<Piece>& grads, void* stream,
                                             const Engine::Event* own_in) {
  const RingShape& r = s_.ring;
  std::vector<ColumnRunOrder> orders(u_);
  for (int i = 0; i < u_; ++i) orders[i] = column_run_order(r.mask, n_, u_, i, heads_, kv_heads_);
  const int64_t n = n_, D = r.head_dim;
  const size_t el = elem_size(r, Elem::output);
  // My tokens of my heads in output `t` ([B, n, heads, D]) from the step's first entry.
  const auto own = [&](const attnhost_tensor& t, const Piece& p) {
    const int64_t token = int64_t{p.heads} * D;
    return TensorRef{static_cast<char*>(t.data) + (step.b0 * n * token + first_head(member_, p, step.group) * D) * el,
                     n * token, token, D};
  };
  std::vector<RingAttention::ColumnRun> runs;
  for (int t = 0; t < u_; ++t) {
    const int m = orders[member_].members[t];
    RingAttention::ColumnRun run{{m * n, (m + 1) * n}, {}, {}, {}};
    if (m == member_) {
      run.dk = own(a.dk, grads[1]);
      run.dv = own(a.dv, grads[2]);
    }
    for (int i : orders[member_].final_rows[t])
      run.rows.push_back({{i * n, (i + 1) * n}, i == member_ ? own(a.dq, grads[0]) : TensorRef{}});
    runs.push_back(run);
  }
  void* receive = overlap_ ? host_.stream(1) : stream;
  engine_->wait(receive, engine_->record(host_.stream(0)));  // the caller is done with the outputs
  void* lead = overlap_ ? receive : nullptr;
  const auto after = [&](size_t t) {
    // Piece p of member i's run t, for member j (another).
    const auto finished = [&](int i, size_t p, int j) {
      if (i == j) return false;
      const std::vector<int>& rows = orders[i].final_rows[t];
      return p == 0 ? std::find(rows.begin(), rows.end(), j) != rows.end() : orders[i].members[t] == j;
    };
    bool any = false;
    for (int i = 0; i < u_; ++i)
      for (size_t p = 0; p < grads.size(); ++p) any = any || finished(member_, p, i) || finished(i, p, member_);
    if (!any) return;
    Moves moves;
    moves.which = [&](size_t p, int i, bool out) { return out ? finished(member_, p, i) : finished(i, p, member_); };
    moves.receive = receive;
    to_tokens(grads, step, stream, stream, "dQ dK dV to tokens, run " + std::to_string(t), moves);
  };
  if (own_in)
    ring_->backward_in_runs(x, step.b0, step.count, runs, stream, lead, after,
                            {{member_ * n, (member_ + 1) * n}, *own_in});
  else
    ring_->backward_in_runs(x, step.b0, step.count, runs, stream, lead, after);
  engine_->wait(stream, engine_->record(receive));
}

int64_t UlyssesAttention::rank_pairs() const { return ring_->rank_pairs() * groups_; }

}  // namespace attncore::plugin
