// Context parallelism by a ring of K/V blocks (docs/VARIANTS.md, ring and zigzag).
//
// Each rank keeps its queries; the K/V blocks travel. At step i rank r holds the block that
// started on rank (r - i) mod P, attends its queries to it while that block moves on to r + 1 on
// a stream of its own, and merges the partial output in fp32. A block carries only the keys that
// the ranks still ahead of it reach (a window reaches a few; a causal block nothing once past the
// last rank), and a hop that carries nothing is not made. Backward sends the block round again
// with its fp32 dK/dV accumulators; the last hop takes the finished sums home in the problem
// dtype, straight into dK and dV. Where the other ranks reach little of each block (windows), the
// gradients go home instead: each rank keeps its own block's in fp32, and a rank sends what it
// computed of another's block straight to its owner, which adds it in. The whole ring may run once
// per slice of the batch and of the heads (RingShape::batch_slices, head_slices), which divides its
// buffers by the count.
//
// A variant says only which attention calls a step makes (RingPlan); this file is the schedule,
// the double buffers, the stream ordering and the merges, shared by every ring-shaped variant.
#pragma once

#include "attncore/plugin/dense_mask.h"
#include "attncore/plugin/engine.h"
#include "attncore/plugin/schedule.h"
#include "attncore/plugin/workspace.h"

#include <attnhost/plugin.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace attncore::plugin {

// One attention call of a step: local query rows [q_begin, q_end) against columns
// [kv_begin, kv_end) of the block in hand, whose first row and column sit at global positions
// q_pos0 and kv_pos0. `masked` is false when every pair in the call is visible (the dense mask's
// causal/window then stay off). A variant with more structure adds segments (varlen: rows and
// columns relative to the call's ranges, positions global) or a block list (block-sparse), whose
// arrays it owns on the instance's device, and then says how many pairs the call computes.
struct BlockCall {
  int64_t q_begin, q_end, kv_begin, kv_end;
  int64_t q_pos0, kv_pos0;
  bool masked;
  const Segment* segments = nullptr;
  int32_t num_segments = 0;
  const BlockList* blocks = nullptr;
  int64_t pairs = -1;  // per (batch, head); -1: count from the dense mask
  // The backward's segments, when they differ from the forward's (nullptr: the same). A forward
  // may carry segments of rows that attend nothing in the call, so that it writes every row of
  // [q_begin, q_end) (O = 0, LSE = -inf), which the merge over those rows needs; the backward has
  // nothing to do for them, and may want the others in another order for its kernels. A list
  // with no segment: no backward call.
  const Segment* backward_segments = nullptr;
  int32_t num_backward_segments = 0;
};

// The calls rank `rank` makes at the step that brings the block of rank `source`. Asked for every
// rank, not only this one: what the others reach of a block decides what travels. Asked first when
// the ring first runs (a plugin may fill its plan after constructing the ring).
using RingPlan = std::function<std::vector<BlockCall>(int rank, int source)>;
// Where member `member`'s block lies in the sequence: its runs of tokens in local order, as a
// variant's layout gives them.
using BlockRuns = std::function<attnhost::Layout(int member)>;

struct RingShape {
  int32_t dtype = ATTNHOST_DTYPE_BF16;
  int32_t batch = 1, heads_q = 1, heads_kv = 1, head_dim = 128;
  int64_t local_q = 0, local_kv = 0;  // tokens per rank (the tensors' token extent)
  float softmax_scale = 1.f;
  DenseMask mask;                     // the problem's causal and window
  bool deterministic = false;
  // The ring runs over this many slices of the batch, one after another: the receive buffers and
  // the fp32 workspace are sized for one slice (about 1/batch_slices of the whole). 1: no slicing.
  int32_t batch_slices = 1;
  // And over this many slices of the key/value heads (each with its query heads) within a batch
  // slice, for a batch too small to slice: a slice's inputs are packed into buffers of their own
  // and its outputs unpacked, since a message must be one contiguous block. 1: no slicing.
  int32_t head_slices = 1;
  // dK and dV come out in fp32 (the backward's dk and dv tensors are fp32): gradients that are summed
  // further (ulysses's replicated kv heads) are rounded once, after the sum.
  bool kv_grads_fp32 = false;
  // Where the backward's gradients go home (set_block_reach): at most this many columns of a block
  // travel, and its owner keeps at most kept_columns of its own in fp32; the receive buffers and the
  // workspace are sized for them. -1: every column travels, and the gradients travel with it.
  int64_t carried_columns = -1, kept_columns = -1;
  // The forward's batch slices where they differ; 0: the fewest whose buffers fit in the
  // backward's (a forward holds no fp32 gradients), RingAttention::forward_shape.
  int32_t forward_batch_slices = 0;
  // The backward's delta and fp32 dQ in two sets, where it runs several batch slices one after
  // another: the next slice's are made on the fill stream under this one's steps, and this one's
  // dQ rounded there under the next one's (docs/KERNELS.md, "Filling the last wave").
  // choose_slices sets it and counts it in its memory rule.
  bool double_rows = false;
  // The backward takes each member's own block last (set_own_last, then choose_slices, which counts
  // it): at world size 2, over several batch slices, where a member's own block is one call over all
  // its keys. A slice's share of the other member's block is computed first and sent home in fp32;
  // the own block runs a slice later, in one call that adds the share that came home meanwhile and
  // writes dK and dV (attncore's BackwardParams::dk_add). No pass adds or rounds gradients, and what
  // ends the pass is the own call, not a hop home (docs/KERNELS.md, "Shares home, own block last").
  // A third row set then; the three fp32 pairs take turns at being computed, sent and received.
  bool own_last = false;
  // Two members, no window: the forward gathers the keys its rows reach in sequence order, its own
  // and the other member's, into a buffer of its own, and makes one call a run of its rows over them,
  // writing O directly: no fp32 partial and no merge, rows as long as at world size 1 (docs/KERNELS.md,
  // "The forward joined at two ranks"). The ring takes it where it is given where the blocks lie
  // (RingAttention::set_block_runs), over a batch of two or more (an entry a slice, the first slice
  // the ring's steps) with heads whole. set_joined_forward sets it, before choose_slices, which counts
  // its two key buffers.
  bool joined_forward = false;
};

// A rank's fp32 row buffers, which the ring and routed schedules carve (workspace.h): the forward's
// running output, and one call's partial output and LSE to merge into it; the backward's delta
// and dQ accumulator.
struct RowBuffers {
  float *o_acc = nullptr, *o_part = nullptr, *lse_part = nullptr;  // forward
  float *delta = nullptr, *dq = nullptr;                            // backward
};

// The ranks a ring runs over: member i (0 <= i < size) is world rank first + i * stride. A plan's
// `rank` and `source` are members. Every rank of the world is one ring (first 0, stride 1), or one
// of several rings side by side (usp: a ring of the ranks with the same place in their Ulysses group).
struct RingMembers {
  int position = 0, size = 1;
  int first = 0, stride = 1;
  int rank_of(int member) const { return first + member * stride; }
};

// Sets carried_columns and kept_columns of `s` from what the members of a ring of `world_size`
// running `plan` reach of one another's blocks, where the gradients are better sent home than round
// the ring: where each block's message home in fp32 is no longer than the block in the problem dtype,
// and the others reach at most 2/3 of it (a sliding window). Else leaves them -1.
void set_block_reach(RingShape& s, const RingPlan& plan, int world_size);
// Sets joined_forward of `s` where a ring of `world_size` can join its forward.
void set_joined_forward(RingShape& s, int world_size);
// Sets own_last of `s` where a ring of `world_size` running `plan` can take each member's own block
// last: two members whose gradients travel (set_block_reach left them so), each with one call over
// every key of its own block, and exact fp32 partials (`dtype_partials` false). choose_slices keeps
// it only where there are several batch slices.
void set_own_last(RingShape& s, const RingPlan& plan, int world_size, bool dtype_partials);
// (10.3) The attended pairs of call `c` of a ring over `s`, per batch entry and head.
int64_t call_pairs(const RingShape& s, const BlockCall& c);

class RingAttention {
 public:
  // A ring of every rank of the world (options.rank of options.world_size), or of `members`.
  RingAttention(const RingShape& shape, RingPlan plan, const ScheduleOptions& options)
      : RingAttention(shape, std::move(plan), options, RingMembers{options.rank, options.world_size, 0, 1}) {}
  RingAttention(const RingShape& shape, RingPlan plan, const ScheduleOptions& options, RingMembers members);

  void forward(const attnhost_forward_args& a);
  void backward(const attnhost_backward_args& a);
  // Where every member's block lies: what a joined forward (RingShape::joined_forward) needs.
  void set_block_runs(BlockRuns runs) { runs_ = std::move(runs); }
  // The ring over batch entries [b0, b0 + count) alone, the args' tensors holding the whole batch:
  // a caller's pipeline over entries. An FP8 pass's amax is reported by the whole-batch calls above.
  // The backward returns the point on the fill stream after which dQ is written; dK and dV are
  // written on the compute stream.
  void forward(const attnhost_forward_args& a, int32_t b0, int32_t count);
  Engine::Event backward(const attnhost_backward_args& a, int32_t b0, int32_t count);
  // A ring of one member (Ulysses over every rank): the backward over entries [b0, b0 + count) as
  // one call a run of the block's columns, in the order given, so that a caller can send what each
  // run finishes while the later runs compute. The runs cut the block's columns [0, local_kv)
  // exactly (takes_runs() says whether this ring can). Run i writes its columns of dK and dV, then
  // `rounding` waits for every run up to i and rounds out dQ's rows that run i finishes (on the last
  // run, those a RowsOut gives a tensor of on the compute stream after after(i): see the 10.4 form),
  // and after(i) is called: what the caller queues on `rounding` there comes after run i. Where the engine adds
  // dQ by atomics and the problem need not be reproducible, run 0 goes on `lead`, a stream of
  // greater priority than the compute stream, and the later runs on the compute stream beside it:
  // their blocks fill its last wave, and it still ends first (at equal priority the GPU may run
  // whichever kernel it finds ready first whole). Null `lead`: every run on the compute stream.
  // A TensorRef with data is where a run's outputs go instead of the args' tensors (its first
  // column or row at the run's), e.g. straight into a caller's own layout.
  struct RowsOut {
    Interval rows;
    TensorRef dq{};
  };
  struct ColumnRun {
    Interval columns;
    TensorRef dk{}, dv{};
    std::vector<RowsOut> rows;
  };
  bool takes_runs() const;
  int members() const { return world_; }  // (10.1) the ring's
  void backward_in_runs(const attnhost_backward_args& a, int32_t b0, int32_t count, const std::vector<ColumnRun>& runs,
                        void* rounding, void* lead, const std::function<void(size_t)>& after);
  // (10.4) The same, where the rows `early.rows` of dO (and O) are in place at `early.ready`, before
  // the rest, which are there at the compute stream's position: their delta, and dQ's clearing, are
  // made first, the other rows' once the rest is in (a Ulysses member's own tokens, copied while
  // its peers' come over). In both, the last run's rows that a RowsOut gives a tensor of are rounded
  // on the compute stream, after after(i), beside what it queued: the caller's rows that leave go
  // first.
  struct EarlyRows {
    Interval rows;
    Engine::Event ready;
  };
  void backward_in_runs(const attnhost_backward_args& a, int32_t b0, int32_t count, const std::vector<ColumnRun>& runs,
                        void* rounding, void* lead, const std::function<void(size_t)>& after, const EarlyRows& early);
  // Pairs this rank computes (every call of every step, batch and heads included).
  int64_t rank_pairs() const;
  // The bytes a ring of `shape` allocates beyond the problem's tensors (receive buffers and the
  // larger of the forward's and the backward's workspace), for one slice of the batch.
  static size_t workspace_bytes(const RingShape& shape, int world_size);
  // `shape` at the batch slices its forward runs over (see RingShape::batch_slices).
  static RingShape forward_shape(const RingShape& shape, int world_size);

 private:
  struct KV {
    void* k;
    void* v;
  };
  int source(int step) const { return ((rank_ - step) % world_ + world_) % world_; }
  int member_at(int step) const { return (rank_ + step) % world_; }  // who holds this rank's block at `step`
  // The columns of member `source`'s block that members still ahead of it reach from `step` on: what
  // the hop into `step` carries (empty: no hop).
  const Interval& carried(int step, int source) const { return carried_[size_t(step) * world_ + source]; }
  // The columns of `source`'s block that the member holding it at `step` reaches.
  const Interval& reached(int step, int source) const { return reached_[size_t(step) * world_ + source]; }
  void plan_reach();  // fills carried_ and reached_, once
  // A [batch, width, heads_kv, D] buffer whose column c is column first + c of a block.
  struct Columns {
    void* data;
    int64_t width, first;
    int32_t dtype;
  };
  // How the member holding block `src` at `step` lays it out: its own block whole, another's in the
  // columns the first hop carries (all of them, where the gradients travel).
  Columns held(int step, int src, void* data) const;
  // Columns `cols` of `b` to (send) or from member `peer`, whose buffer is laid out as `peer_b`: one
  // message when they are all of both buffers, else one a batch entry.
  void transfer(bool send, const Columns& b, const Columns& peer_b, Interval cols, int peer, const RingShape& s,
                void* stream);
  // The view of `b` from block column `column`, [batch, token, head, D].
  TensorRef view(const Columns& b, int64_t column, const RingShape& s) const;
  static size_t block_bytes(const RingShape& s);  // one receive buffer of K or V
  // A slice of heads packed into buffers of its own: Q-like and K/V-like [batch, tokens, heads, D],
  // inputs in the problem dtype and outputs in theirs (bf16 for FP8), LSE [batch, heads, tokens].
  struct Packed {
    void *q = nullptr, *o = nullptr, *d_o = nullptr, *dq = nullptr, *k = nullptr, *v = nullptr, *dk = nullptr,
         *dv = nullptr;
    float* lse = nullptr;
  };
  static Packed take_packed(Carver& c, const RingShape& s);
  // A pass's buffers (workspace.h), sized for the largest slice. Both passes: the two K/V receive
  // buffers (world size above 1) and a head slice's packed tensors (head_slices above 1). The
  // forward: its rows' fp32 output (RowBuffers). The backward: its rows' terms, then fp32 dK/dV
  // pairs: [0] and [1] computed in turn while [2] receives (one pair on a ring of one); where the
  // gradients go home, `kept` holds the own block's kept columns and the pairs carried columns.
  struct Buffers {
    KV receive[2]{};
    Packed packed;
    RowBuffers rows[3];  // [1]: the backward's second set (double_rows); [2]: its third (own_last)
    KV kept{}, grads[3]{};
    KV joined[2]{};      // a joined forward's keys of two slices in turn, in sequence order
  };
  static Buffers layout(Carver& c, Pass pass, const RingShape& shape, int world_size);
  static Buffers carve(Carver& c, Pass pass, const RingShape& shape, int world_size);  // at its own slices
  // One slice of the ring: batch entries [b0, b0 + shape.batch) and key/value heads
  // [h0, h0 + shape.heads_kv) with their query heads. A slice of fewer heads than the problem's is
  // packed: its tensors are copied into buffers of their own (a message must be contiguous).
  struct Slice {
    RingShape shape;
    int32_t b0, h0;
    bool packed, last;
  };
  std::vector<Slice> slices(const RingShape& sliced, int32_t b0, int32_t count) const;  // of entries [b0, b0 + count)
  // A tensor of a packed slice: its data is swapped for `buffer`, an input is packed into it
  // first, an output unpacked from it after.
  enum class Kind { q, kv, stats };  // [B, tokens, heads, D] by Q's or K/V's heads; [B, heads, tokens]
  struct Swap {
    attnhost_tensor* t;
    void* buffer;
    Kind kind;
    bool input;
    void* full = nullptr;
  };
  void pack(const Slice& slice, std::vector<Swap>& swaps, void* stream);
  void unpack(const Slice& slice, const std::vector<Swap>& swaps, void* stream);
  // `el`: the tensor's element size (its own dtype: an FP8 problem's outputs are bf16).
  void move_heads(void* packed, void* full, Kind kind, size_t el, const Slice& slice, bool pack, void* stream);
  // The ring over one slice: `s` is its shape, the args point at its tensors. A backward that is
  // not `last` leaves its last dK/dV hop on the communication stream, under the next slice's first
  // step; the last one waits for it.
  void forward_slice(const RingShape& s, const attnhost_forward_args& a);
  // A joined forward (RingShape::joined_forward) over slices `list` of `a`'s entries. Its calls
  // and messages, the same for every slice: the keys [0, width) of the sequence that this member's
  // rows reach, each run copied from its own block or received from the other's; the calls over them
  // (`own`: over the own block's K and V, where its keys lie there in one run).
  struct Joined {
    struct Piece {
      int64_t global, local, length;  // a run of keys: where in the sequence, where in its block
    };
    int64_t width = 0;
    std::vector<Piece> copied, received, sent;  // sent: what the other member receives, in its order
    std::vector<std::pair<BlockCall, bool>> calls;  // (call, own)
  };
  const Joined& joined();  // this member's, made once
  bool joins(const std::vector<Slice>& list) const;
  void forward_joined(const attnhost_forward_args& a, const std::vector<Slice>& list);
  // `prologue`: where its delta and zeroed dQ are ready (null: made on the compute stream already).
  // `kept`: the forward's hop, where it is this slice's first (forward_hop_kept).
  struct Prefetch;
  void backward_slice(const RingShape& s, const attnhost_backward_args& a, bool last, const RowBuffers& rows,
                      const Engine::Event& prologue, const Prefetch& kept);
  // A backward slice's prologue, its delta and zeroed fp32 dQ in `rows`, made on the fill stream
  // once `inputs` are there; returns where it is done. `whole` holds the whole batch.
  Engine::Event prepare(const attnhost_backward_args& whole, const Slice& slice, const RowBuffers& rows,
                        const Engine::Event& inputs, const EarlyRows* early = nullptr);
  void backward_runs(const attnhost_backward_args& a, int32_t b0, int32_t count, const std::vector<ColumnRun>& runs,
                     void* rounding, void* lead, const std::function<void(size_t)>& after, const EarlyRows* early);
  // Zeroes the columns of an fp32 dK/dV pair outside [begin, end), every batch entry.
  void zero_outside(const RingShape& s, const KV& grad, int64_t begin, int64_t end, void* stream);
  // A finished fp32 dK or dV of a ring of one into the output: rounded, or copied (kv_grads_fp32).
  void finish_kv_grad(const RingShape& s, const float* grad, void* out, void* stream);
  void exchange(const void* send_k, const void* send_v, void* recv_k, void* recv_v, int32_t dtype, size_t count,
                void* stream, const char* what, int step);
  // The K/V hop into step + 1: the block in hand on to the next member, the previous member's in,
  // each cut to carried(). False when neither way carries anything.
  bool pass_kv(const RingShape& s, KV in_hand, KV into, int step, void* stream);
  // The first K/V hop of a backward with its own block last, made at the end of a whole-batch
  // forward, under its last step (docs/KERNELS.md, "The backward's first block, sent by the forward"):
  // into the backward's first receive buffer, which a forward of two members never uses. A backward
  // given the same K and V tensors (address, dtype, shape, strides) starts computing at once; any
  // backward forgets it. The contract, as a framework's autograd keeps it: a backward after its
  // forward reads K and V unchanged, on every rank alike (each rank decides for itself, and the
  // two must agree on which hops they make).
  struct Prefetch {
    bool made = false;
    attnhost_tensor k{}, v{};  // the forward's
    Engine::Event arrived;     // on the communication stream
  };
  Prefetch prefetch_backward_kv(const attnhost_forward_args& a, const Engine::Event& begun);
  // Where the gradients go home (carried_columns set), two members and one slice each pass: the
  // forward's one hop (the columns of the block before that a window reaches) is the backward's first,
  // into the same receive buffer, which nothing between the two passes writes. Kept, the backward
  // makes no hop before its first remote call (the same contract as prefetch_backward_kv's).
  Prefetch forward_hop_kept(const attnhost_forward_args& a);
  Engine::Event backward_entries(const attnhost_backward_args& a, int32_t b0, int32_t count, const Prefetch& kept);
  // The backward over slices `list` with each rank's own block last (RingShape::own_last); returns
  // where dQ is written on the fill stream. `sent`: slice 0's block, if the forward sent it.
  Engine::Event backward_own_last(const attnhost_backward_args& a, const std::vector<Slice>& list,
                                  const Engine::Event& inputs, const Prefetch& sent);
  // The backward where the gradients go home from every step (RingShape::carried_columns set).
  void backward_home(const RingShape& s, const attnhost_backward_args& a, const RowBuffers& rows,
                     const Engine::Event& prologue, const Prefetch& kept);

  RingShape s_;
  RingShape forward_s_;  // s_ at the forward's batch slices (forward_shape)
  RingPlan plan_;
  std::vector<Interval> carried_, reached_;  // by [step * world + source]
  attnhost::Host host_;
  RingMembers members_;
  int rank_, world_;  // this rank's place in the ring, and the ring's size
  bool overlap_, dtype_partials_;
  std::unique_ptr<Engine> engine_;
  Workspace<Buffers> work_;
  void* fill_;  // host stream 3 where there is one, else the compute stream
  Prefetch prefetched_;
  BlockRuns runs_;
  std::optional<Joined> joined_;
};

}  // namespace attncore::plugin
