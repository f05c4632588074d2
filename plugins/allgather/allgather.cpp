// allgather: context parallelism by gathered K/V (docs/VARIANTS.md; Llama 3's). Q stays sharded
// (zigzag chunks when causal, contiguous otherwise); every rank gathers the K/V its rows reach, in
// global order, and each of its query chunks attends the keys its mask reaches in one call of the
// core: no partial outputs, no merges. The backward is cut one of two ways (`backward`). By keys,
// each rank gathers the rows that reach its own keys (Q, dO, LSE, delta) and takes its keys against
// all of them, one call a key chunk that writes dK and dV whole, so that a CTA walks a key's whole
// column; the fp32 dQ of the peers' rows goes home to be summed (key_call). By rows, as the forward:
// K/V gathered again, dQ added locally, and each rank's fp32 dK/dV partials home, its calls writing
// each key's partials once rather than adding into zeroed ones (plan_pieces).
//
// The heads go in groups through a pipeline: group g + 1 is gathered (stream 1) while group g
// computes, into the other of two buffers; in the backward, group g - 1's gradients go home on
// stream 2 meanwhile. Each buffer holds one group's gathered tokens for the whole sequence (and, in
// the backward, their fp32 gradients), so the group count sets the memory: head_groups = 0 takes
// the fewest groups with which a rank's memory stays within 1.5x of its working set (Q, K, V, O,
// LSE, dO, dQ, dK, dV) plus one gathered group.
#include "attncore/plugin/blocks.h"
#include "attncore/plugin/dense_plans.h"
#include "attncore/plugin/ring_plugin.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace {

using namespace attncore;
using namespace attncore::plugin;

inline constexpr auto kParams = with_packed_ring_params(std::array{
    attnhost_param_spec{ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "head_groups", ATTNHOST_PARAM_INT, "0",
                        "gather K/V in this many groups of kv heads, each under the previous group's attention; 0: the "
                        "fewest that keep a rank's memory within 1.5x of its working set plus one gathered group (the "
                        "backward's: the forward, which holds no gradients, takes larger groups in the same memory "
                        "where blocks go as they lie)",
                        nullptr},
    attnhost_param_spec{ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "exchange", ATTNHOST_PARAM_STRING,
                        "\"auto\"",
                        "how a peer's K/V ranges and dK/dV partials move: auto: each range as it lies, one copy by the "
                        "copy engines, where the host moves strided blocks (GPUs that reach one another's memory, the "
                        "CPU), else packed; packed: into one message a peer by the copy kernel",
                        "auto|packed"},
    attnhost_param_spec{ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "backward", ATTNHOST_PARAM_STRING,
                        "\"auto\"",
                        "how the backward is cut: keys: each rank's keys against the gathered rows that reach them (Q, "
                        "dO, LSE and delta gathered, dK and dV written whole, fp32 dQ partials home), so that a backward "
                        "CTA walks a key's whole column; rows: each rank's rows against the gathered keys, as the "
                        "forward (fp32 dK and dV partials home); auto: keys where the query heads are the kv heads and "
                        "blocks go as they lie, else rows. keys needs blocks that go as they lie (not exchange=packed)",
                        "auto|keys|rows"},
    attnhost_param_spec{ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "taper", ATTNHOST_PARAM_STRING, "\"on\"",
                        "a pass's first group holds a third of the others' heads (head_groups' or auto's size), so "
                        "that the first gather, which no call covers, takes a third as long, and the last what "
                        "remains, one group more (the forward's, and the backward's by keys); off: groups of one size",
                        "on|off"}});

class Allgather {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
        "allgather",
        "1.0.0",
        "all-gathered K/V: each rank's query chunks attend the gathered keys in one call each; dK/dV summed home",
        {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims), kRingDevices, kRingDtypesFp8,
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_NONCAUSAL | ATTNHOST_FEATURE_WINDOW | ATTNHOST_FEATURE_GQA |
             ATTNHOST_FEATURE_BACKWARD | ATTNHOST_FEATURE_DETERMINISTIC,
         1, 0, 0, nullptr},
        static_cast<int32_t>(kParams.size()),
        kParams.data(),
    };
    return info;
  }

  static void validate(const attnhost::Problem& p) {
    validate_dense(p);
    if (p.get_int("head_groups") < 0 || (p.get_int("head_groups") > 0 && p->heads_kv % p.get_int("head_groups") != 0))
      attnhost::fail(ATTNHOST_ERR_INVALID_ARGUMENT, "head_groups must be 0 (auto) or divide the " +
                                                        std::to_string(p->heads_kv) + " kv heads");
    if (p.get_string("backward") == "keys" && p.get_string("exchange") == "packed")
      attnhost::fail(ATTNHOST_ERR_INVALID_ARGUMENT,
                     "backward=keys moves blocks as they lie; exchange=packed takes backward=rows or auto");
  }

  Allgather(const attnhost::Problem& p, attnhost::Host host) : Allgather(p, schedule_options(p, host)) {}
  Allgather(const attnhost::Problem& p, const ScheduleOptions& options)
      : reference_(p), host_(options.host), rank_(options.rank), world_(options.world_size), seqlen_(p->seqlen_q),
        batch_(static_cast<int32_t>(p->batch)), heads_(p->heads_q), kv_heads_(p->heads_kv), dim_(p->head_dim),
        dtype_(p->dtype), el_(attnhost::dtype_size(p->dtype)),
        out_el_(size_t(dtype_bytes(output_dtype(core_dtype(p->dtype))))), scale_(static_cast<float>(p->softmax_scale)),
        deterministic_(p->deterministic != 0), overlap_(options.overlap),
        direct_(p.get_string("exchange") != "packed" && host_.blocks()), engine_(options.make_engine()) {
    if (overlap_ && !deterministic_) fill_ = host_.stream(3);
    // Zigzag chunks balance a causal mask (when the sequence cuts into 2P of them); else contiguous.
    const bool zigzag = world_ > 1 && p->causal && seqlen_ % (2 * world_) == 0;
    for (int member = 0; member < world_; ++member) {
      attnhost::Layout l;
      if (zigzag) ZigzagPlan(reference_.mask(), world_).add_block(l, member);
      else ContiguousPlan(reference_.mask(), world_).add_block(l, member);
      const attnhost_layout v = l.view();
      ranges_.emplace_back(v.ranges, v.ranges + v.num_ranges);
    }
    local_ = zigzag ? ZigzagPlan(reference_.mask(), world_).block_tokens() : ContiguousPlan(reference_.mask(), world_).block_tokens();
    const std::string& backward = p.get_string("backward");
    by_keys_ = backward != "rows" && (world_ == 1 || direct_) && (backward == "keys" || heads_ == kv_heads_);
    taper_ = p.get_string("taper") != "off";
    for (Reach* table : {&keys_reached_, &rows_reaching_})
      table->assign(world_, std::vector<std::vector<attnhost_token_range>>(world_));
    for (int owner = 0; owner < world_; ++owner)
      for (int other = 0; other < world_; ++other) {
        keys_reached_[owner][other] = reach(owner, other, &Allgather::keys_of);
        rows_reaching_[owner][other] = reach(owner, other, &Allgather::rows_of);
      }
    row_split_ = split(&Allgather::keys_of);
    key_split_ = split(&Allgather::rows_of);
    plan_pieces();
    for (const attnhost_token_range& r : ranges_[rank_]) layout_.add(r.global_begin, r.length);
    layout_.pad(local_ - layout_.local_tokens());
    groups_ = choose_groups(p.get_int("head_groups"));
    forward_groups_ = p.get_int("head_groups") > 0 ? groups_ : forward_groups_for(groups_);
    allocate();
  }

  attnhost_layout layout(int32_t) { return layout_.view(); }

  void forward(const attnhost_forward_args& a) {
    bounds_ = taper_ ? tapered_groups(forward_groups_) : even_groups(forward_groups_);
    void* compute = host_.stream(0);
    void* gs = overlap_ ? host_.stream(1) : compute;
    // The sends on a stream of their own: at two ranks, causal, rank 1 sends both its chunks and
    // receives one, and its first calls waited 150 us for its sends at large on two H200s
    // (docs/KERNELS.md, "Allgather: one call a query chunk").
    void* ss = overlap_ ? host_.stream(2) : compute;
    const int groups = pass_groups();
    std::vector<Engine::Event> gathered(groups);
    std::vector<Calls> done(groups);
    for (void* s : {gs, ss}) engine_->wait(s, compute);  // the inputs are ready
    gather(a.k.data, a.v.data, 0, gs, compute, ss);  // (the compute stream has nothing else to do yet)
    gathered[0] = engine_->record(gs);
    for (int g = 0; g < groups; ++g) {
      const int32_t range = host_.range_begin(("attention group " + std::to_string(g)).c_str(), ATTNHOST_RANGE_COMPUTE, compute);
      done[g] = group_calls(g, compute, fill_, gathered[g], row_split_, nullptr,
                            [&](const attnhost_token_range& r, void* s) { engine_->forward(forward_call(a, r, g), s); });
      host_.range_end(range, compute);
      if (g + 1 < groups) {  // (after the calls are queued: the host meets the peers here)
        if (g > 0) wait_for(gs, done[g - 1]);  // its buffer was read by group g - 1
        gather(a.k.data, a.v.data, g + 1, gs, gs, ss);
        gathered[g + 1] = engine_->record(gs);
      }
    }
    for (const Calls& c : done) wait_for(compute, c);
    engine_->wait(compute, gs);
    engine_->wait(compute, ss);
    if (attnhost_fp8_amax* amax = fp8_amax(a)) report_amax(&amax->o, a.o.data, heads_, compute);
  }

  // The gathers and the gradients home run on streams of their own: on one stream, group g + 1's
  // gather waited behind group g - 1's gradients home, and ran uncovered between two groups'
  // attention (docs/KERNELS.md, "Allgather's backward"). Between calls the compute stream holds
  // nothing: a slot's dQ is zeroed, and a group's rounded, on the stream that sends the gradients
  // home (docs/KERNELS.md, "Allgather: nothing but calls between calls"). By rows, a group gathers K
  // and V and its calls write dK and dV partials (plan_pieces); by keys, it gathers the rows that
  // reach this rank's keys and its calls write dK and dV whole (key_call).
  void backward(const attnhost_backward_args& a) {
    bounds_ = by_keys_ && taper_ ? tapered_groups(groups_) : even_groups(groups_);
    void* compute = host_.stream(0);
    void* gs = overlap_ ? host_.stream(1) : compute;
    void* xs = overlap_ ? host_.stream(2) : compute;
    const int groups = pass_groups();
    // The first gather waits only for what it sends. By rows that is K and V: queued behind the
    // delta pass, it started 88 us later at medium on two H200s. By keys it sends delta too, so the
    // first group's is made first. (The delta pass is queued first all the same: the gather's group
    // may hold the host until the peers reach it.) The first gather's own ranges and slot 0's zeroing
    // go on the gradients' stream, idle until the first call ends; slot 1's zeroing after the gather.
    const Engine::Event inputs = engine_->record(compute);
    const int32_t first_heads = by_keys_ ? group_q(0) : heads_;
    compute_delta(a, 0, first_heads, compute);
    const Engine::Event first_delta = engine_->record(compute);
    if (first_heads < heads_) compute_delta(a, first_heads, heads_ - first_heads, compute);
    const Engine::Event delta = engine_->record(compute);
    if (fill_) engine_->wait(fill_, delta);  // (calls there read delta)
    for (void* s : {gs, xs}) engine_->wait(s, by_keys_ ? first_delta : inputs);
    gather_group(a, 0, gs, xs);
    std::vector<Engine::Event> gathered(groups), cleared(groups);
    std::vector<Calls> done(groups);
    Engine::Event summed;  // the last group's partials home read (the incoming messages free)
    gathered[0] = engine_->record(gs);
    if (by_keys_) engine_->wait(gs, delta);  // (the next gathers send every group's)
    clear(0, xs);
    cleared[0] = engine_->record(xs);  // (and the own ranges of the first gather)
    if (groups > 1) {
      clear(1, gs);
      cleared[1] = engine_->record(gs);
    }
    for (int g = 0; g < groups; ++g) {
      for (void* s : {compute, fill_ ? fill_ : compute}) {
        engine_->wait(s, cleared[g]);
        if (!by_keys_) engine_->wait(s, gathered[g]);  // (by keys, group_calls waits)
      }
      const int32_t range = host_.range_begin(("attention backward group " + std::to_string(g)).c_str(),
                                              ATTNHOST_RANGE_COMPUTE, compute);
      Calls peers_whole;  // by keys: where the peers' rows' dQ is whole
      if (by_keys_) {
        // Calls side by side add dQ into the same rows: only where the engine adds it by atomics.
        bool atomic = true;
        for (int i : key_split_.order) atomic = atomic && engine_->adds_dq_atomically(key_call(a, ranges_[rank_][i], g));
        done[g] = group_calls(g, compute, atomic ? fill_ : nullptr, gathered[g], key_split_, &peers_whole,
                              [&](const attnhost_token_range& r, void* s) { engine_->backward(key_call(a, r, g), s); });
      } else if (g + 1 < groups || world_ == 1) {
        done[g] = backward_pieces(a, g, whole_, compute);
      } else {  // the last group: the peers' keys first, their partials home under this rank's own
        wait_for(xs, backward_pieces(a, g, peers_, compute));
        send_partials(partials(a, g), xs, gs, summed);
        done[g] = backward_pieces(a, g, own_, compute);
      }
      host_.range_end(range, compute);
      if (g + 1 < groups) {  // (after the calls are queued, as in the forward)
        if (g > 0) wait_for(gs, done[g - 1]);  // what it gathers into its slot was read by group g - 1
        gather_group(a, g + 1, gs, gs);
        gathered[g + 1] = engine_->record(gs);
      }
      const Partials home = partials(a, g);
      if (by_keys_) {
        wait_for(xs, peers_whole);
        send_partials(home, xs, gs, summed);
      }
      wait_for(xs, done[g]);
      if (!by_keys_ && g + 1 < groups) send_partials(home, xs, gs, summed);
      if (!by_keys_) convert_dq(a, g, xs);  // this group's dQ is whole
      if (by_keys_ || world_ > 1) sum_home(home, xs);  // (by rows at world size 1 the calls wrote dK and dV)
      summed = engine_->record(xs);
      if (g + 2 < groups) {  // the slot serves group g + 2
        clear(g + 2, xs);
        cleared[g + 2] = engine_->record(xs);
      }
    }
    engine_->wait(compute, gs);
    engine_->wait(compute, xs);
    if (attnhost_fp8_amax* amax = fp8_amax(a)) {  // every output is home
      report_amax(&amax->dq, a.dq.data, heads_, compute);
      report_amax(&amax->dk, a.dk.data, kv_heads_, compute);
      report_amax(&amax->dv, a.dv.data, kv_heads_, compute);
    }
  }

  attnhost::PairCount count_pairs() {
    const DenseMask& m = reference_.mask();
    int64_t pairs = 0;
    for (const attnhost_token_range& r : ranges_[rank_]) pairs += m.pairs(r.global_begin, r.global_begin + r.length, 0, seqlen_);
    return {pairs * batch_ * heads_, reference_.total_pairs()};
  }
  attnhost_span_list enumerate_keys(int64_t b, int32_t h, int64_t q) { return reference_.enumerate_keys(b, h, q); }
  attnhost_span_list enumerate_queries(int64_t b, int32_t kv_head, int64_t key) {
    return reference_.enumerate_queries(b, kv_head, key);
  }

 private:
  using Reach = std::vector<std::vector<std::vector<attnhost_token_range>>>;  // [owner][other]: reach(owner, other, ..)
  // One group's buffers, the forward's K and V from its start. By rows: the gathered K and V, [B, S,
  // the group's kv heads, D], their fp32 gradients (this rank's share), and the fp32 dQ of this
  // rank's rows, [B, local tokens, the group's query heads, D]. By keys: the gathered Q and dO, [B,
  // S, the group's query heads, D], their rows' fp32 dQ (this rank's share), and LSE and delta, [B,
  // the group's query heads, S].
  struct Slot {
    char* base = nullptr;
    char *k = nullptr, *v = nullptr;
    float *dk = nullptr, *dv = nullptr;
    char *q = nullptr, *d_o = nullptr;
    float *lse = nullptr, *delta = nullptr;
    float* dq = nullptr;
  };
  // Both passes' buffers (attncore/plugin/workspace.h): two slots, the pipeline's; delta; the
  // gradients' messages to and from every peer; this rank's K and V of a group, side by side, and
  // the gathered ones from every peer (apart from the gradients': the two overlap).
  struct Buffers {
    Slot slots[2];
    float* delta = nullptr;
    char *home = nullptr, *packed = nullptr, *gathered_in = nullptr;
  };

  // Where a group's calls end: the compute stream's point, and the fill stream's where calls went
  // there (else null). Whatever reads or rewrites the group's buffers waits for both (wait_for); the
  // next group's calls need not (they use the other slot), so one stream's calls of the next group
  // run beside the other's of this one.
  struct Calls {
    Engine::Event compute, fill;
  };
  void wait_for(void* stream, const Calls& c) {
    engine_->wait(stream, c.compute);
    engine_->wait(stream, c.fill);
  }
  // A group's calls, one a range of this rank in `order` (row_split_'s: the forward's, a query range
  // each; key_split_'s: the backward's by keys, a key range each). The range with the most pairs goes
  // first, on the compute stream, and the others beside it on the fill stream, so that their blocks
  // fill its last wave rather than run after it in waves of their own (docs/KERNELS.md, "Allgather:
  // the ranges side by side"); with no fill stream (a deterministic problem, or calls that may not
  // run at once) they keep one stream. The calls beside get a compute range of their own: the
  // compute stream's range ends before they do, and the trace's exposed communication counts what
  // no compute range covers.
  template <class Call>
  Calls for_each_range(void* compute, void* fill, const std::vector<int>& order, Call&& call) {
    const std::vector<attnhost_token_range>& ranges = ranges_[rank_];
    if (!fill || order.size() < 2) {
      for (int i : order) call(ranges[i], compute);
      return {engine_->record(compute), nullptr};
    }
    engine_->wait(fill, compute);
    call(ranges[order[0]], compute);
    const int32_t range = host_.range_begin("attention beside", ATTNHOST_RANGE_COMPUTE, fill);
    for (size_t i = 1; i < order.size(); ++i) call(ranges[order[i]], fill);
    host_.range_end(range, fill);
    return {engine_->record(compute), engine_->record(fill)};
  }
  // Slot g % 2's fp32 dQ zeroed for group g, as many heads as that group holds (dK and dV are
  // written, not added into: plan_pieces, key_call).
  void clear(int g, void* stream) { engine_->zero(slot(g).dq, slot_dq_elems(group_q(g)) * 4, stream); }
  // A backward piece: one of this rank's query ranges against the keys it reaches, or the part of
  // them one rank owns. Each key's dK and dV are written, not added by atomics, so that none are
  // zeroed. Of a rank's two ranges (zigzag's chunks) the one reaching fewer keys writes first, on
  // the fill stream beside the previous group's calls; the other then writes its keys on the compute
  // stream, the first's added in place over the keys both reach (BackwardParams::dk_add). At two
  // ranks, causal, rank 0's chunk 0 (of four) writes keys [0, 2048), then its chunk 3 writes
  // [0, 8192) with chunk 0's added (docs/KERNELS.md, "Allgather: each key's gradients written once").
  struct Piece {
    bool first;    // of the range written first (else of the other, after it)
    int range;     // of ranges_[rank_]
    Interval keys;
    Interval add;  // keys the first range wrote, added before this piece writes (empty: none)
  };
  // The groups' pieces but the last's (each range whole), and the last group's cut where the keys'
  // owner changes, the peers' then this rank's: the peers' partials are whole when their pieces end,
  // and go home under this rank's own (docs/KERNELS.md, "Allgather: the last group's partials home
  // early"). A rank has one range or two.
  void plan_pieces() {
    const std::vector<attnhost_token_range>& mine = ranges_[rank_];
    int first = -1;  // (none where a rank has one range)
    if (mine.size() == 2) first = keys_of(mine[0]).size() <= keys_of(mine[1]).size() ? 0 : 1;
    const Interval written = first >= 0 ? keys_of(mine[first]) : Interval{};
    for (int i = 0; i < int(mine.size()); ++i) {
      const Interval reach = keys_of(mine[i]);
      const auto piece = [&](Interval keys) {
        const Interval add = overlap(keys, written);
        return Piece{i == first, i, keys, i == first || add.size() == 0 ? Interval{} : add};
      };
      whole_.push_back(piece(reach));
      std::vector<Interval> sides[2];  // the parts of the reach the peers own, and this rank's
      for (int owner = 0; owner < world_; ++owner)
        for (const attnhost_token_range& r : ranges_[owner]) {
          const Interval part = overlap(reach, global(r));
          if (part.size() > 0) sides[owner == rank_].push_back(part);
        }
      for (const Interval& keys : joined(sides[0])) peers_.push_back(piece(keys));
      for (const Interval& keys : joined(sides[1])) own_.push_back(piece(keys));
    }
    for (std::vector<Piece>* pieces : {&whole_, &peers_, &own_})  // the first range's before the other's
      std::stable_sort(pieces->begin(), pieces->end(), [](const Piece& x, const Piece& y) { return x.first > y.first; });
  }
  // A list's pieces of group g: the first range's on the fill stream, the other's on the compute
  // stream, from the first that adds on once those are done (all on the compute stream where there
  // is no fill stream).
  Calls backward_pieces(const attnhost_backward_args& a, int g, const std::vector<Piece>& pieces, void* compute) {
    void* beside = fill_ ? fill_ : compute;
    int32_t range = -1;
    bool waited = false;
    for (const Piece& piece : pieces) {
      if (piece.first && beside != compute && range < 0)
        range = host_.range_begin("attention beside", ATTNHOST_RANGE_COMPUTE, beside);
      if (!piece.first && piece.add.size() > 0 && !waited) {  // (the first range's pieces come first)
        engine_->wait(compute, beside);
        waited = true;
      }
      engine_->backward(piece_call(a, piece, g), piece.first ? beside : compute);
    }
    if (range >= 0) host_.range_end(range, beside);
    return {engine_->record(compute), beside != compute ? engine_->record(beside) : nullptr};
  }
  BackwardParams piece_call(const attnhost_backward_args& a, const Piece& piece, int g) const {
    BackwardParams p = backward_call(a, ranges_[rank_][piece.range], g, piece.keys);
    p.write_dkdv = true;
    if (world_ == 1) {  // one call makes every key's gradients whole: straight into dK and dV
      p.dk = kv_like(a.dk.data, piece.keys.lo, kv0(g), out_el_);  // (global positions are local)
      p.dv = kv_like(a.dv.data, piece.keys.lo, kv0(g), out_el_);
      return p;
    }
    p.write_dkdv_fp32 = true;
    if (piece.add.size() > 0) {  // in place: a CTA reads its keys' earlier gradients, then writes them
      p.dk_add = p.dk;
      p.dv_add = p.dv;
      p.add_begin = piece.add.lo - piece.keys.lo;
      p.add_end = piece.add.hi - piece.keys.lo;
    }
    return p;
  }
  // The pass in progress's groups of kv heads: group g holds [bounds_[g], bounds_[g + 1]), and the
  // query heads that read them.
  int pass_groups() const { return int(bounds_.size()) - 1; }
  int32_t kv0(int g) const { return bounds_[g]; }
  int32_t group_kv(int g) const { return bounds_[g + 1] - bounds_[g]; }
  int32_t q0(int g) const { return kv0(g) * (heads_ / kv_heads_); }
  int32_t group_q(int g) const { return group_kv(g) * (heads_ / kv_heads_); }
  std::vector<int32_t> even_groups(int32_t groups) const {
    std::vector<int32_t> bounds;
    for (int32_t g = 0; g <= groups; ++g) bounds.push_back(g * (kv_heads_ / groups));
    return bounds;
  }
  // A pass's first group holds a third of the others' kv heads (at least one), so that the first
  // gather, which no call covers, takes a third as long; the others hold the pass's `groups` size,
  // but the last, which holds what remains (by keys it sends its dQ home after every call). Middle
  // groups keep the full size: a backward call of long key columns runs in whole waves of CTAs, and
  // 5 heads of 24 took the 3 waves 6 did at medium on two ranks (docs/KERNELS.md, "Allgather: the
  // backward by keys"). There the backward's groups of 6 become 2, 6, 6, 6 and 4, the forward's of
  // 12 become 4, 12 and 8.
  std::vector<int32_t> tapered_groups(int32_t groups) const {
    const int32_t most = kv_heads_ / groups, first = std::max(1, most / 3);
    if (world_ == 1 || most < 2) return even_groups(groups);
    std::vector<int32_t> bounds = {0};
    for (int32_t at = first; at < kv_heads_; at += most) bounds.push_back(at);
    bounds.push_back(kv_heads_);
    return bounds;
  }
  // A slot's fp32 dQ for `heads` query heads: this rank's rows by rows, every row by keys.
  size_t slot_dq_elems(int32_t heads) const { return size_t(batch_) * (by_keys_ ? seqlen_ : local_) * heads * dim_; }
  size_t gathered_elems(int g) const { return size_t(batch_) * seqlen_ * group_kv(g) * dim_; }
  size_t q_elems() const { return size_t(batch_) * local_ * heads_ * dim_; }
  size_t local_kv_elems(int32_t kv) const { return size_t(batch_) * local_ * kv * dim_; }

  // The fewest groups (dividing the kv heads) within the memory rule above, or the one asked for. A
  // gathered group is K and V by rows, Q and dO by keys.
  int32_t choose_groups(int64_t asked) const {
    if (asked > 0) return static_cast<int32_t>(asked);
    if (world_ == 1) return 1;
    const double q = double(q_elems()) * el_, kv = double(local_kv_elems(kv_heads_)) * el_;
    const double lse = double(batch_) * heads_ * local_ * 4;
    const double working_set = 4 * q + 4 * kv + lse;
    for (int32_t g = 1; g <= kv_heads_; ++g) {
      if (kv_heads_ % g != 0) continue;
      const int32_t heads = by_keys_ ? heads_ / g : kv_heads_ / g;
      const double chunk = 2.0 * batch_ * seqlen_ * heads * dim_ * el_;
      const double extra = 2.0 * slot_bytes(g) + lse + staging_bytes(g);
      if (working_set + extra <= 1.5 * working_set + chunk) return g;
    }
    return kv_heads_;
  }
  // A slot's bytes for `groups` backward groups (layout's carving).
  size_t slot_bytes(int32_t groups) const {
    Carver c;
    carve_slot(c, groups);
    return c.used();
  }
  Slot carve_slot(Carver& c, int32_t groups) const {
    const int32_t kv = kv_heads_ / groups, q = heads_ / groups;
    Slot slot;
    if (by_keys_) {
      const size_t rows = size_t(batch_) * seqlen_ * q * dim_;
      slot.base = slot.q = c.take(rows * el_);
      slot.d_o = c.take(rows * el_);
      slot.dq = c.take<float>(rows * 4);
      slot.lse = c.take<float>(size_t(batch_) * q * seqlen_ * 4);
      slot.delta = c.take<float>(size_t(batch_) * q * seqlen_ * 4);
      return slot;
    }
    const size_t gathered = size_t(batch_) * seqlen_ * kv * dim_;
    slot.base = slot.k = c.take(gathered * el_);
    slot.v = c.take(gathered * el_);
    slot.dk = c.take<float>(2 * gathered * 4);
    slot.dv = slot.dk ? slot.dk + gathered : nullptr;
    slot.dq = c.take<float>(size_t(batch_) * local_ * q * dim_ * 4);
    return slot;
  }
  // The forward holds no gradients: its groups are the fewest whose K and V fit in a slot the
  // backward's `groups` size, so its calls are longer (at medium on two ranks by rows, 3 groups of 8
  // kv heads in the room of 8 groups of 3: their K, V and fp32 gradients). Only where blocks go as
  // they lie: packed messages would need staging sized for the larger group.
  int32_t forward_groups_for(int32_t groups) const {
    if (!direct_ || world_ == 1) return groups;
    const size_t per_group = size_t(batch_) * seqlen_ * (kv_heads_ / groups) * dim_;
    const size_t room = by_keys_ ? slot_bytes(groups) : 2 * align_up(per_group * el_) + align_up(2 * per_group * 4);
    for (int32_t g = 1; g < groups; ++g)
      if (kv_heads_ % g == 0 && 2 * align_up(size_t(batch_) * seqlen_ * (kv_heads_ / g) * dim_ * el_) <= room) return g;
    return groups;
  }
  // The messages to and from the peers (a group's fp32 partials of a rank's tokens, each way), this
  // rank's K and V of a forward group, packed, and the peers' (layout). Where blocks go as they lie,
  // only the messages in.
  double staging_bytes(int32_t groups) const {
    const double messages = double(world_ - 1) * (direct_ ? 1 : 2) * message_bytes(groups);
    if (direct_) return messages;
    return messages + kv_message_bytes(kv_heads_ / forward_groups_for(groups)) +
           double(world_ - 1) * kv_message_bytes(kv_heads_ / groups);
  }

  void allocate() {
    work_ = Workspace<Buffers>(host_, [&](Carver& c, Pass) { return layout(c); });
  }
  // Sized by the backward's groups; the forward's K and V fit in its slots (kv_slot).
  Buffers layout(Carver& c) const {
    const int32_t kv = kv_heads_ / groups_;
    Buffers b;
    for (Slot& slot : b.slots) slot = carve_slot(c, groups_);
    b.delta = c.take<float>(size_t(batch_) * heads_ * local_ * 4);
    b.home = c.take(size_t(world_ - 1) * (direct_ ? 1 : 2) * message_bytes(groups_));  // (direct: incoming only)
    const bool packed = world_ > 1 && !direct_;
    b.packed = c.take(packed ? kv_message_bytes(kv_heads_ / forward_groups_) : 0);  // K, then V from its next 256 bytes
    b.gathered_in = c.take(packed ? size_t(world_ - 1) * kv_message_bytes(kv) : 0);
    return b;
  }
  const Buffers& buffers() const { return work_.forward(); }
  const Slot& slot(int g) const { return buffers().slots[g % 2]; }
  // Slot g % 2's K and V for the pass's groups: the backward's as laid out, the forward's larger
  // ones from the slot's start (V after K), over the room of the backward's K, V and gradients.
  std::pair<char*, char*> kv_slot(int g) const {
    char* k = slot(g).base;
    return {k, k + align_up(gathered_elems(g) * el_)};
  }

  // [B, local tokens, heads, D] views of a Q-like tensor from local row `row0` and head `head0`.
  // (el: the tensor's element size, the inputs' el_ or the outputs' out_el_.)
  TensorRef token_view(void* base, int32_t heads, int64_t row0, int32_t head0, size_t el) const {
    const int64_t token = int64_t{heads} * dim_;
    return {static_cast<char*>(base) + (row0 * token + int64_t{head0} * dim_) * el, local_ * token, token, dim_};
  }
  TensorRef q_like(void* base, int64_t row0, int32_t head0, size_t el) const {
    return token_view(base, heads_, row0, head0, el);
  }
  TensorRef kv_like(void* base, int64_t row0, int32_t head0, size_t el) const {
    return token_view(base, kv_heads_, row0, head0, el);
  }
  // [B, S, heads, D] views of a slot's tensor of `heads` heads from global position `pos0`.
  TensorRef in_slot(void* base, int64_t pos0, int32_t heads, size_t el) const {
    const int64_t token = int64_t{heads} * dim_;
    return {static_cast<char*>(base) + pos0 * token * el, seqlen_ * token, token, dim_};
  }
  TensorRef gathered(int g, void* base, int64_t key0, bool fp32) const {
    return in_slot(base, key0, group_kv(g), fp32 ? 4 : el_);
  }
  TensorRef group_dq(int g, int64_t row0) const {  // [B, local tokens, the group's query heads, D], fp32
    const int64_t token = int64_t{group_q(g)} * dim_;
    return {slot(g).dq + row0 * token, local_ * token, token, dim_};
  }
  void convert_dq(const attnhost_backward_args& a, int g, void* stream) {
    ConvertParams cv;
    cv.dtype = output_dtype(core_dtype(dtype_));
    cv.batch = batch_;
    cv.heads = group_q(g);
    cv.head_dim = dim_;
    cv.seqlen = local_;
    cv.src = group_dq(g, 0);
    cv.dst = q_like(a.dq.data, 0, q0(g), out_el_);
    engine_->convert(cv, stream);
  }
  RowStatsRef rows(float* base, int64_t row0, int32_t head0) const {
    return {base + int64_t{head0} * local_ + row0, int64_t{heads_} * local_, local_};
  }

  // The keys rows [r.global_begin, + r.length) reach under the mask: one interval (its ends never
  // decrease with the row).
  Interval keys_of(const attnhost_token_range& r) const {
    const DenseMask& m = reference_.mask();
    return {m.keys_of(r.global_begin).lo, m.keys_of(r.global_begin + r.length - 1).hi};
  }
  static Interval global(const attnhost_token_range& r) { return {r.global_begin, r.global_begin + r.length}; }
  static Interval overlap(Interval x, Interval y) { return {std::max(x.lo, y.lo), std::min(x.hi, y.hi)}; }
  // Intervals that overlap or touch made one, in order.
  static std::vector<Interval> joined(std::vector<Interval> v) {
    std::sort(v.begin(), v.end(), [](const Interval& x, const Interval& y) { return x.lo < y.lo; });
    std::vector<Interval> out;
    for (const Interval& k : v) {
      if (!out.empty() && out.back().hi >= k.lo) out.back().hi = std::max(out.back().hi, k.hi);
      else out.push_back(k);
    }
    return out;
  }
  // The rows that reach keys [r.global_begin, + r.length): one interval, as keys_of's.
  Interval rows_of(const attnhost_token_range& r) const {
    const DenseMask& m = reference_.mask();
    return {m.queries_of(r.global_begin).lo, m.queries_of(r.global_begin + r.length - 1).hi};
  }
  // The parts of `owner`'s ranges that `other`'s ranges reach through `reached` (keys_of: the keys
  // other's rows attend; rows_of: the rows that attend other's keys), each a token range at its
  // global and owner-local position: what a gather brings `other` from `owner`, and the partials
  // `other` sends `owner` home. A window leaves most of them out, a causal mask the last ranks'
  // second chunks (docs/KERNELS.md, "Allgather: only the keys a rank reaches").
  using Reached = Interval (Allgather::*)(const attnhost_token_range&) const;
  std::vector<attnhost_token_range> reach(int owner, int other, Reached reached) const {
    std::vector<attnhost_token_range> parts;
    for (const attnhost_token_range& k : ranges_[owner]) {
      std::vector<Interval> cut;
      for (const attnhost_token_range& q : ranges_[other]) {
        const Interval part = overlap((this->*reached)(q), global(k));
        if (part.size() > 0) cut.push_back(part);
      }
      for (const Interval& m : joined(cut))  // (other's ranges may reach overlapping tokens)
        parts.push_back({m.lo, k.local_begin + (m.lo - k.global_begin), m.size()});
    }
    return parts;
  }
  // This rank's ranges in the order of a group's calls, those with the most pairs through `reached`
  // first (the later first where they tie), and cut into those whose reach lies in this rank's own
  // ranges and the others (group_calls).
  struct Split {
    std::vector<int> order, own, peers;
  };
  Split split(Reached reached) const {
    const DenseMask& m = reference_.mask();
    const std::vector<attnhost_token_range>& mine = ranges_[rank_];
    const auto pairs = [&](int i) {
      const Interval own = global(mine[i]), other = (this->*reached)(mine[i]);
      return reached == &Allgather::keys_of ? m.pairs(own.lo, own.hi, other.lo, other.hi)
                                            : m.pairs(other.lo, other.hi, own.lo, own.hi);
    };
    Split out;
    for (int i = int(mine.size()) - 1; i >= 0; --i) out.order.push_back(i);
    std::stable_sort(out.order.begin(), out.order.end(), [&](int x, int y) { return pairs(x) > pairs(y); });
    for (int i : out.order) {
      bool peers = false;
      for (int owner = 0; owner < world_; ++owner)
        for (const attnhost_token_range& r : ranges_[owner])
          peers |= owner != rank_ && overlap((this->*reached)(mine[i]), global(r)).size() > 0;
      (peers ? out.peers : out.own).push_back(i);
    }
    return out;
  }
  Mask mask_at(int64_t q_pos0, int64_t kv_pos0) const {
    const DenseMask& m = reference_.mask();
    Mask mask;
    mask.causal = m.causal;
    mask.window_left = m.window_left;
    mask.window_right = m.window_right;
    mask.q_pos0 = q_pos0;
    mask.kv_pos0 = kv_pos0;
    return mask;
  }

  // What every call of group g shares: the shape of rows at global positions [rows.lo, rows.hi)
  // against keys at [keys.lo, keys.hi), the mask at those positions, and an FP8 problem's descales
  // of Q, K and V.
  template <class Params>
  Params shaped(int g, Interval rows, Interval keys, const attnhost_fp8_scaling* fp8) const {
    Params p;
    p.dtype = core_dtype(dtype_);
    p.batch = batch_;
    p.heads_q = group_q(g);
    p.heads_kv = group_kv(g);
    p.head_dim = dim_;
    p.seqlen_q = rows.size();
    p.seqlen_kv = keys.size();
    p.softmax_scale = scale_;
    p.mask = mask_at(rows.lo, keys.lo);
    if (fp8) {
      p.descale_q = fp8->descale_q;
      p.descale_k = fp8->descale_k;
      p.descale_v = fp8->descale_v;
    }
    return p;
  }
  // What a forward and a backward call of query range r share: that, Q, and the gathered K and V
  // from the first key the range reaches.
  template <class Params>
  Params call(const TensorRef& q, const attnhost_token_range& r, int g, const attnhost_fp8_scaling* fp8,
              Interval keys) const {
    Params p = shaped<Params>(g, global(r), keys, fp8);
    p.q = q;
    p.k = gathered(g, kv_slot(g).first, keys.lo, false);
    p.v = gathered(g, kv_slot(g).second, keys.lo, false);
    return p;
  }

  ForwardParams forward_call(const attnhost_forward_args& a, const attnhost_token_range& r, int g) const {
    const int32_t head0 = q0(g);
    ForwardParams p = call<ForwardParams>(q_like(a.q.data, r.local_begin, head0, el_), r, g, fp8_scaling(a), keys_of(r));
    p.o = q_like(a.o.data, r.local_begin, head0, out_el_);
    p.lse = rows(static_cast<float*>(a.lse.data), r.local_begin, head0);
    return p;
  }

  // (Over `keys`, the keys the range reaches or a part of them.)
  BackwardParams backward_call(const attnhost_backward_args& a, const attnhost_token_range& r, int g,
                               Interval keys) const {
    const int32_t head0 = q0(g);
    BackwardParams p = call<BackwardParams>(q_like(a.q.data, r.local_begin, head0, el_), r, g, fp8_scaling(a), keys);
    p.d_o = q_like(a.d_o.data, r.local_begin, head0, el_);
    p.o = q_like(a.o.data, r.local_begin, head0, out_el_);
    if (const attnhost_fp8_scaling* fp8 = fp8_scaling(a)) p.descale_do = fp8->descale_do;
    p.lse = rows(static_cast<float*>(a.lse.data), r.local_begin, head0);
    p.delta = rows(buffers().delta, r.local_begin, head0);
    p.dq = group_dq(g, r.local_begin);
    p.dk = gathered(g, slot(g).dk, keys.lo, true);
    p.dv = gathered(g, slot(g).dv, keys.lo, true);
    p.deterministic = deterministic_;
    return p;
  }

  // A group's calls, one a range of this rank's in split.order (for_each_range), once its gather is
  // in. Where some ranges read only this rank's own tokens and others a peer's too (at two ranks,
  // causal, rank 0's first chunk of rows reaches only its own keys, and its last chunk of keys only
  // its own rows), the others run on the compute stream and those beside them on the fill stream:
  // in the first group they start under the gather, not waiting for it, and what waits for the
  // peers' share of the group (*peers_whole where asked: by keys, the peers' dQ home) waits for the
  // compute stream's calls alone. Rank 0 is the one that waits longest for its first gather and sends the
  // most home last (docs/KERNELS.md, "Allgather: the backward by keys").
  template <class Call>
  Calls group_calls(int g, void* compute, void* fill, const Engine::Event& gathered, const Split& split,
                    Calls* peers_whole, Call&& call) {
    if (!fill || split.own.empty() || split.peers.empty()) {
      for (void* s : {compute, fill ? fill : compute}) engine_->wait(s, gathered);
      const Calls done = for_each_range(compute, fill, split.order, call);
      if (peers_whole) *peers_whole = done;
      return done;
    }
    // The compute stream's calls are launched first, as in for_each_range: of two kernels ready at
    // once, the one launched first takes the SMs first. In the first group those calls wait for the
    // gather, and the calls beside, which do not, run meanwhile.
    engine_->wait(fill, compute);  // (beside this group's calls, after the last group's; the first's own ranges)
    if (g > 0) engine_->wait(fill, gathered);  // (later groups' own ranges come with their gather)
    engine_->wait(compute, gathered);
    for (int i : split.peers) call(ranges_[rank_][i], compute);
    const Engine::Event peers_done = engine_->record(compute);
    if (peers_whole) *peers_whole = {peers_done, nullptr};
    const int32_t range = host_.range_begin("attention beside", ATTNHOST_RANGE_COMPUTE, fill);
    for (int i : split.own) call(ranges_[rank_][i], fill);
    host_.range_end(range, fill);
    return {peers_done, engine_->record(fill)};
  }
  // By keys: this rank's key range kr of group g against every row that reaches it, one call that
  // writes its keys' dK and dV whole, in the dtype, and adds the rows' dQ into the slot's fp32 (the
  // peers' rows' share goes home). A CTA walks a key's whole column, all ranks' rows, where by rows
  // it walks one range's (docs/KERNELS.md, "Allgather: the backward by keys"). At world size 1 the
  // rows are this rank's own, read where they lie.
  BackwardParams key_call(const attnhost_backward_args& a, const attnhost_token_range& kr, int g) const {
    const Interval reaching = rows_of(kr);
    const int32_t q_heads = group_q(g), head0 = q0(g), kv_head0 = kv0(g);
    const attnhost_fp8_scaling* fp8 = fp8_scaling(a);
    BackwardParams p = shaped<BackwardParams>(g, reaching, global(kr), fp8);
    if (fp8) p.descale_do = fp8->descale_do;
    if (world_ == 1) {  // (global positions are local)
      p.q = q_like(a.q.data, reaching.lo, head0, el_);
      p.d_o = q_like(a.d_o.data, reaching.lo, head0, el_);
      p.lse = rows(static_cast<float*>(a.lse.data), reaching.lo, head0);
      p.delta = rows(buffers().delta, reaching.lo, head0);
    } else {
      p.q = in_slot(slot(g).q, reaching.lo, q_heads, el_);
      p.d_o = in_slot(slot(g).d_o, reaching.lo, q_heads, el_);
      p.lse = {slot(g).lse + reaching.lo, int64_t{q_heads} * seqlen_, seqlen_};
      p.delta = {slot(g).delta + reaching.lo, int64_t{q_heads} * seqlen_, seqlen_};
    }
    p.dq = in_slot(slot(g).dq, reaching.lo, q_heads, 4);
    p.k = kv_like(a.k.data, kr.local_begin, kv_head0, el_);
    p.v = kv_like(a.v.data, kr.local_begin, kv_head0, el_);
    p.dk = kv_like(a.dk.data, kr.local_begin, kv_head0, out_el_);
    p.dv = kv_like(a.dv.data, kr.local_begin, kv_head0, out_el_);
    p.write_dkdv = true;
    p.deterministic = deterministic_;
    return p;
  }
  // delta of heads [head0, head0 + heads) of this rank's rows.
  void compute_delta(const attnhost_backward_args& a, int32_t head0, int32_t heads, void* stream) {
    DeltaParams dp;
    dp.dtype = core_dtype(dtype_);
    dp.batch = batch_;
    dp.heads = heads;
    dp.head_dim = dim_;
    dp.seqlen = local_;
    dp.o = q_like(a.o.data, 0, head0, out_el_);
    dp.d_o = q_like(a.d_o.data, 0, head0, el_);
    if (const attnhost_fp8_scaling* fp8 = fp8_scaling(a)) dp.descale_do = fp8->descale_do;
    dp.delta = rows(buffers().delta, 0, head0);
    engine_->compute_delta(dp, stream);
  }

  // Group g's K and V from every rank into slot g % 2, each range at its global position. Where the
  // host moves blocks, each range goes as it lies from a rank's K/V into the peers' slots, one copy
  // by the copy engines (docs/KERNELS.md, "Blocks as they lie"); else one message each way between
  // every two ranks: this rank's K and V slices packed side by side, a peer's unpacked range by
  // range (docs/KERNELS.md, "All-to-all messages"). This rank's own ranges are copied on `own`;
  // blocks sent as they lie go out on `sends`, so that what waits for `stream` waits for what this
  // rank receives, not for what it sends (a packed message is sent from `stream`, where it is packed).
  void gather(void* k, void* v, int g, void* stream, void* own, void* sends) {
    const int32_t kv = group_kv(g);
    const size_t row = size_t(kv) * dim_ * el_, local_batch = local_ * row, global_batch = seqlen_ * row;
    const size_t half = align_up(batch_ * local_batch);  // one tensor in a message (kv_message_bytes)
    const size_t pitch = size_t(kv_heads_) * dim_ * el_;  // a token of K or V
    const size_t head0 = size_t(kv0(g)) * dim_ * el_;
    const char* mine[2] = {static_cast<char*>(k) + head0, static_cast<char*>(v) + head0};
    char* into[2] = {kv_slot(g).first, kv_slot(g).second};
    const int32_t range = host_.range_begin(("K V gather group " + std::to_string(g)).c_str(), ATTNHOST_RANGE_COMMUNICATION, stream);
    const auto mine_at = [&](int t, const attnhost_token_range& r) {  // [B, r.length, the group's kv heads, D]
      return make_block(const_cast<char*>(mine[t]) + r.local_begin * pitch, row, r.length, pitch, batch_, local_ * pitch);
    };
    const auto slot_at = [&](int t, const attnhost_token_range& r) {
      return make_block(into[t] + r.global_begin * row, row, r.length, row, batch_, global_batch);
    };
    const auto message_at = [&](char* message, int t, const attnhost_token_range& r) {  // a range in a packed message
      return make_block(message + t * half + r.local_begin * row, row, r.length, row, batch_, local_batch);
    };
    const bool packed = world_ > 1 && !direct_;
    if (packed)  // this rank's K and V side by side: its message
      for (int t = 0; t < 2; ++t)
        engine_->copy_rows(buffers().packed + t * half, row, mine[t], pitch, row, size_t(batch_) * local_, stream);
    if (world_ > 1) {
      host_.group_start();
      for (int peer = 0; peer < world_; ++peer) {
        if (peer == rank_) continue;
        if (packed) {
          host_.send(buffers().packed, 2 * half, ATTNHOST_DTYPE_UINT8, peer, stream);
          host_.recv(gathered_in(peer, g), 2 * half, ATTNHOST_DTYPE_UINT8, peer, stream);
          continue;
        }
        for (int t = 0; t < 2; ++t) {  // each part the peer reaches straight to its place in the peer's slot
          for (const attnhost_token_range& r : keys_reached_[rank_][peer]) host_.send_block(mine_at(t, r), peer, sends);
          for (const attnhost_token_range& r : keys_reached_[peer][rank_]) host_.recv_block(slot_at(t, r), peer, stream);
        }
      }
      host_.group_end();
    }
    if (packed)
      for (int peer = 0; peer < world_; ++peer)
        if (peer != rank_)
          for (int t = 0; t < 2; ++t)
            for (const attnhost_token_range& r : ranges_[peer])
              copy_block(*engine_, slot_at(t, r), message_at(gathered_in(peer, g), t, r), stream);
    // The own ranges straight from K and V, after the messages: the group is where the host meets
    // the peers (docs/KERNELS.md, "The host's order at a pass's start").
    for (int t = 0; t < 2; ++t)
      for (const attnhost_token_range& r : ranges_[rank_]) copy_block(*engine_, slot_at(t, r), mine_at(t, r), own);
    host_.range_end(range, stream);
  }

  // Group g's gather into slot g % 2: K and V by rows, the rows that reach this rank's keys by keys
  // (none at world size 1, whose calls read the rows where they lie).
  void gather_group(const attnhost_backward_args& a, int g, void* stream, void* own) {
    if (!by_keys_) return gather(a.k.data, a.v.data, g, stream, own, stream);
    if (world_ > 1) gather_rows(a, g, stream, own);
  }
  // By keys, group g's rows that reach this rank's keys, from every rank into slot g % 2 at their
  // global positions: Q and dO, [B, tokens, the group's query heads, D], and LSE and delta, [B, the
  // group's query heads, tokens], each part as it lies, one copy by the copy engines. This rank's
  // own ranges are copied on `own`.
  void gather_rows(const attnhost_backward_args& a, int g, void* stream, void* own) {
    const int32_t heads = group_q(g), head0 = q0(g);
    const size_t row = size_t(heads) * dim_ * el_, pitch = size_t(heads_) * dim_ * el_;
    char* const tokens[2] = {static_cast<char*>(a.q.data) + head0 * dim_ * el_,
                             static_cast<char*>(a.d_o.data) + head0 * dim_ * el_};
    char* const tokens_into[2] = {slot(g).q, slot(g).d_o};
    float* const stats[2] = {static_cast<float*>(a.lse.data) + int64_t{head0} * local_,
                             buffers().delta + int64_t{head0} * local_};
    float* const stats_into[2] = {slot(g).lse, slot(g).delta};
    // Part t of range r (Q, dO, LSE, delta) on this rank, and in the slot.
    const auto mine_at = [&](int t, const attnhost_token_range& r) {
      if (t < 2) return make_block(tokens[t] + r.local_begin * pitch, row, r.length, pitch, batch_, local_ * pitch);
      return make_block(stats[t - 2] + r.local_begin, r.length * 4, heads, local_ * 4, batch_, size_t(heads_) * local_ * 4);
    };
    const auto slot_at = [&](int t, const attnhost_token_range& r) {
      if (t < 2) return make_block(tokens_into[t] + r.global_begin * row, row, r.length, row, batch_, seqlen_ * row);
      return make_block(stats_into[t - 2] + r.global_begin, r.length * 4, heads, seqlen_ * 4, batch_,
                        size_t(heads) * seqlen_ * 4);
    };
    const int32_t range = host_.range_begin(("Q dO gather group " + std::to_string(g)).c_str(), ATTNHOST_RANGE_COMMUNICATION, stream);
    host_.group_start();
    for (int peer = 0; peer < world_; ++peer) {
      if (peer == rank_) continue;
      for (int t = 0; t < 4; ++t) {
        for (const attnhost_token_range& r : rows_reaching_[rank_][peer]) host_.send_block(mine_at(t, r), peer, stream);
        for (const attnhost_token_range& r : rows_reaching_[peer][rank_]) host_.recv_block(slot_at(t, r), peer, stream);
      }
    }
    host_.group_end();
    for (int t = 0; t < 4; ++t)  // (after the messages, as gather's)
      for (const attnhost_token_range& r : ranges_[rank_]) copy_block(*engine_, slot_at(t, r), mine_at(t, r), own);
    host_.range_end(range, stream);
  }

  // What goes home after a backward group: fp32 partials in the slot at global positions, each
  // summed by the rank that owns their tokens into the problem's outputs. By rows, dK and dV of the
  // keys this rank's rows reach; by keys, dQ of the rows that reach this rank's keys.
  struct Partials {
    int count = 0;                 // tensors: dK and dV, or dQ
    float* slot[2] = {};           // [B, S, heads, D] fp32
    void* out[2] = {};             // the problem's, [B, local tokens, out_heads, D]
    int group = 0;
    int32_t heads = 0, head0 = 0;  // the group's, and its first in the outputs
    int32_t out_heads = 0;
    const Reach* reach = nullptr;  // [owner][other]: the parts of owner's ranges other sends home
  };
  Partials partials(const attnhost_backward_args& a, int g) const {
    Partials h;
    if (by_keys_) {
      h.count = 1;
      h.slot[0] = slot(g).dq;
      h.out[0] = a.dq.data;
      h.heads = group_q(g);
      h.head0 = q0(g);
      h.out_heads = heads_;
      h.reach = &rows_reaching_;
    } else {
      h.count = 2;
      h.slot[0] = slot(g).dk;
      h.slot[1] = slot(g).dv;
      h.out[0] = a.dk.data;
      h.out[1] = a.dv.data;
      h.heads = group_kv(g);
      h.head0 = kv0(g);
      h.out_heads = kv_heads_;
      h.reach = &keys_reached_;
    }
    h.group = g;
    return h;
  }
  // A group's partials to their owners, one message a peer (its tokens in its local order, a tensor
  // after the other; as they lie, only the parts this rank reaches or is reached by); sum_home then
  // adds what came home into this rank's own and writes them in the problem dtype. Blocks that move
  // as they lie are received on `receives`, once `incoming_free` (the last group's sum) has read the
  // messages: received on `stream`, they waited for this rank's own calls, which `stream` waits for
  // before it sends, so the peer's came in only after them (docs/KERNELS.md, "Allgather: one call a
  // query chunk"). `stream` waits for them before the sum.
  void send_partials(const Partials& h, void* stream, void* receives, const Engine::Event& incoming_free) {
    if (world_ == 1) return;
    if (!direct_) receives = stream;  // (a packed message is received where it is unpacked)
    engine_->wait(receives, incoming_free);
    const size_t count = size_t(h.heads) * dim_, frow = count * 4, global_batch = seqlen_ * count;
    const size_t half = align_up(batch_ * local_ * frow);
    const std::string name = (h.count == 2 ? "dK dV home group " : "dQ home group ") + std::to_string(h.group);
    const int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMMUNICATION, stream);
    // The peer's ranges of the gathered partials, and where they land in its message from this rank.
    const auto partials = [&](int t, const attnhost_token_range& r) {
      return make_block(h.slot[t] + r.global_begin * count, r.length * frow, batch_, global_batch * 4);
    };
    const auto in_message = [&](char* message, int t, const attnhost_token_range& r) {
      return make_block(message + t * half + r.local_begin * frow, r.length * frow, batch_, local_ * frow);
    };
    if (!direct_)
      for (int peer = 0; peer < world_; ++peer)
        if (peer != rank_)
          for (int t = 0; t < h.count; ++t)
            for (const attnhost_token_range& r : ranges_[peer])
              copy_block(*engine_, in_message(outgoing(peer), t, r), partials(t, r), stream);
    host_.group_start();
    for (int peer = 0; peer < world_; ++peer) {
      if (peer == rank_) continue;
      if (!direct_) {
        host_.send(outgoing(peer), h.count * half, ATTNHOST_DTYPE_UINT8, peer, stream);
        host_.recv(incoming(peer), h.count * half, ATTNHOST_DTYPE_UINT8, peer, stream);
        continue;
      }
      for (int t = 0; t < h.count; ++t) {  // into the peer's message from this rank, as packing would lay them
        for (const attnhost_token_range& r : (*h.reach)[peer][rank_]) host_.send_block(partials(t, r), peer, stream);
        for (const attnhost_token_range& r : (*h.reach)[rank_][peer])
          host_.recv_block(in_message(incoming(peer), t, r), peer, receives);
      }
    }
    host_.group_end();
    if (receives != stream) engine_->wait(stream, engine_->record(receives));
    host_.range_end(range, stream);
  }
  void sum_home(const Partials& h, void* stream) {
    const size_t count = size_t(h.heads) * dim_, frow = count * 4;
    const size_t half = align_up(batch_ * local_ * frow);
    const std::string name = (h.count == 2 ? "dK dV summed group " : "dQ summed group ") + std::to_string(h.group);
    const int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMMUNICATION, stream);
    // A piece's partials from every peer that sent them but the last are added in place (fp32), the
    // last one's in the pass that rounds the sums into the outputs: one launch a piece and tensor,
    // not one a batch entry (docs/KERNELS.md, "Allgather's backward"). A range is cut into pieces
    // where a peer's reach starts or ends: a peer sends the partials of the tokens it reaches alone.
    for (const attnhost_token_range& r : ranges_[rank_]) {
      std::vector<int64_t> cuts = {r.global_begin, r.global_begin + r.length};
      const auto cut = [&](int64_t at) {
        if (at > r.global_begin && at < r.global_begin + r.length) cuts.push_back(at);
      };
      for (int peer = 0; peer < world_; ++peer)
        if (peer != rank_)
          for (const attnhost_token_range& p : (*h.reach)[rank_][peer]) cut(p.global_begin), cut(p.global_begin + p.length);
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        const int64_t lo = cuts[c], local = r.local_begin + (lo - r.global_begin);
        std::vector<int> peers;  // those whose partials of the piece came home
        for (int peer = 0; peer < world_; ++peer)
          if (peer != rank_)
            for (const attnhost_token_range& p : (*h.reach)[rank_][peer])
              if (p.global_begin <= lo && lo < p.global_begin + p.length) peers.push_back(peer);
        for (int t = 0; t < h.count; ++t) {
          const auto from = [&](int peer) {  // the peer's partials of the piece, [B, its length, heads, D]
            return TensorRef{incoming(peer) + t * half + local * frow, local_ * int64_t(count), int64_t(count), dim_};
          };
          ConvertParams cv;
          cv.batch = batch_;
          cv.heads = h.heads;
          cv.head_dim = dim_;
          cv.seqlen = cuts[c + 1] - lo;
          cv.src = in_slot(h.slot[t], lo, h.heads, 4);
          for (size_t i = 0; i + 1 < peers.size(); ++i) {
            ConvertParams sum = cv;
            sum.dtype = DType::fp32;
            sum.dst = cv.src;
            sum.add = from(peers[i]);
            engine_->convert(sum, stream);
          }
          cv.dtype = output_dtype(core_dtype(dtype_));
          cv.dst = token_view(h.out[t], h.out_heads, local, h.head0, out_el_);
          if (!peers.empty()) cv.add = from(peers.back());
          engine_->convert(cv, stream);
        }
      }
    }
    host_.range_end(range, stream);
  }

  // *amax = max |x| of a local output [B, local tokens, heads, D].
  void report_amax(float* amax, void* x, int32_t heads, void* stream) {
    AmaxParams p;
    p.dtype = output_dtype(core_dtype(dtype_));
    p.batch = batch_;
    p.heads = heads;
    p.head_dim = dim_;
    p.seqlen = local_;
    p.x = heads == heads_ ? q_like(x, 0, 0, out_el_) : kv_like(x, 0, 0, out_el_);
    p.amax = amax;
    engine_->amax(p, stream);
  }

  // The backward's messages home (a group's fp32 partials of a rank's tokens: [dK | dV] by rows, dQ
  // by keys), and a group of kv heads' K/V of a rank's tokens, packed (the forward's groups hold at
  // least as many heads as the backward's).
  size_t message_bytes(int32_t groups) const {
    if (by_keys_) return align_up(size_t(batch_) * local_ * (heads_ / groups) * dim_ * 4);
    return 2 * align_up(local_kv_elems(kv_heads_ / groups) * 4);
  }
  size_t kv_message_bytes(int32_t kv) const { return 2 * align_up(local_kv_elems(kv) * el_); }
  // A peer's place among the others (this rank has no message of its own).
  size_t peer_slot(int peer) const { return size_t(peer < rank_ ? peer : peer - 1); }
  char* outgoing(int peer) const { return buffers().home + peer_slot(peer) * 2 * message_bytes(groups_); }  // (packed only)
  char* incoming(int peer) const {
    return buffers().home + (direct_ ? peer_slot(peer) : peer_slot(peer) * 2 + 1) * message_bytes(groups_);
  }
  char* gathered_in(int peer, int g) const {
    return buffers().gathered_in + peer_slot(peer) * kv_message_bytes(group_kv(g));
  }

  DenseReference reference_;
  attnhost::Host host_;
  int rank_, world_;
  int64_t seqlen_;
  int32_t batch_, heads_, kv_heads_, dim_, dtype_;
  size_t el_, out_el_;  // an input's and an output's element (FP8: one byte, and bf16's two)
  float scale_;
  bool deterministic_, overlap_;
  bool direct_;  // ranges moved as they lie (the host's send_block), nothing packed for peers
  std::unique_ptr<Engine> engine_;
  void* fill_ = nullptr;  // host stream 3, where a group's shorter ranges run (null: none)
  std::vector<std::vector<attnhost_token_range>> ranges_;  // each rank's tokens
  Reach keys_reached_;   // the keys of owner's that other's rows reach
  Reach rows_reaching_;  // the rows of owner's that reach other's keys
  Split row_split_, key_split_;  // this rank's ranges as rows (the forward's, by rows) and as keys (by keys)
  bool by_keys_ = false;  // the backward by keys (else by rows: the "backward" parameter)
  std::vector<Piece> whole_, peers_, own_;  // the backward's pieces (plan_pieces)
  int64_t local_ = 0;
  attnhost::Layout layout_;
  int32_t groups_ = 1;          // the backward's groups of kv heads (and the forward's where asked)
  int32_t forward_groups_ = 1;  // the forward's
  std::vector<int32_t> bounds_;  // the pass in progress's groups (kv0, group_kv)
  bool taper_ = true;             // the forward's and (by keys) the backward's first groups smaller (tapered_groups)
  Workspace<Buffers> work_;
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(Allgather)
