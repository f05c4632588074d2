// The dilated attention schedule on one rank: every pattern's attention as core calls, the
// patterns combined by LSE in fp32, the exact backward, and the exchange of dilated K/V rows
// between the ranks that share a segment. The same schedule runs on the CPU and the GPU through
// the core's Engine and the row operations (row_ops.h).
//
// Per pattern (geometry.h says which rows and regions):
//  - strided (every key on this rank, and MHA or r = 1): a query head selects the local tokens
//    p0 + j*r of a segment, and the segments whose rows lie on one such lattice (all of them when
//    w % r == 0) form a class: the rank's own Q/K/V seen with a token stride of r rows from p0 is
//    a dense tensor of the class's rows, and its segments are ranges of j. Heads whose classes
//    have the same segments and whose p0 grow by a fixed step share one core call (View), since
//    one head stride covers both steps: heads 0..r-1 under the paper's offsets, heads of one
//    offset under torchscale's; r = 1 is one call over every head, GQA native. Nothing is copied:
//    the kernels read the rows where they are and add dQ/dK/dV into the rank's fp32 accumulators
//    through the same views. The partial O goes to an fp32 buffer, a block [heads, rows] per
//    view. On a GPU only when the views are large enough to fill it, or when the patterns share it
//    (plan_views).
//  - gathered (otherwise): the selected rows of every (head, segment) are copied into dense
//    buffers [B, heads_q, rows, D] (K/V once per query head, so GQA and per-head offsets are
//    free), and one flash call with heads = 1 attends them, a core Segment per (head, segment),
//    causal on the row index t (the selected rows are in position order).
//  - keys held by other ranks arrive as messages: each rank packs the dilated K/V rows a peer
//    needs (only those: the sparsified K/V), all messages of a pass move in one send/recv group
//    on a stream of their own while the local patterns compute. Q and O never move. In the
//    backward the fp32 dK/dV partials of those rows go back to their owners the same way and are
//    added there (the reduce-scatter of the gathered K/V).
// Forward: combine(O_i, LSE_i) over the patterns -> O, LSE. Backward: delta = rowsum(dO * O) of
// the final output, and each pattern's flash backward with the final LSE and that delta (exact,
// docs/VARIANTS.md); strided patterns and returned partials add into fp32 accumulators, and one pass
// per gradient sums each local row's accumulator and gathered partials and rounds it once. A
// gathered pattern's segments share no keys, so its call writes its fp32 dK/dV partials
// (write_dkdv) rather than adding into zeroed buffers; so does the first strided pattern when its
// views hold every local key.
#pragma once

#include "geometry.h"
#include "row_ops.h"

#include "attncore/attention.h"
#include "attncore/plugin/engine.h"
#include "attncore/plugin/schedule.h"
#include "attncore/plugin/workspace.h"

#include <attnhost/plugin.hpp>

#include <memory>
#include <vector>

namespace dilated {

struct Shape {
  int32_t dtype = ATTNHOST_DTYPE_BF16;
  int32_t batch = 1, heads_q = 1, heads_kv = 1, head_dim = 128;
  float softmax_scale = 1.f;
  // torchscale's backward: the combine weights exp(LSE_i - LSE) are constants, so each pattern's
  // backward uses delta_i = rowsum(dO * O_i) of its own output (recomputed) instead of the final
  // output's. Not the gradient of the forward when patterns overlap; offered to compare.
  bool torchscale_backward = false;
};

class DilatedAttention {
 public:
  DilatedAttention(const Geometry& geometry, const Shape& shape, const attncore::plugin::ScheduleOptions& options);

  void forward(const attnhost_forward_args& a);
  void backward(const attnhost_backward_args& a);
  // (query, key) pairs this rank computes, batch and heads included.
  int64_t rank_pairs() const { return rank_pairs_; }

 private:
  // Dilated K/V rows exchanged with one peer for one pattern. On the sender `rows` indexes its
  // own K/V (token * heads_kv + kv head); on the receiver the pattern's gathered key rows.
  struct Message {
    int peer;
    int64_t rows;  // per batch entry
    const int32_t* table = nullptr;
    size_t table_at = 0;  // offset in the table blob until it is uploaded
  };
  // One core call of a strided pattern: query heads first_head + i * head_step (i < heads), whose
  // rows j < rows are the local tokens p0 + i * p0_step + j * r, with segments [segment_begin,
  // + segment_count) of the pattern's list (ranges of j). Row j of its head i is row
  // partial_row + i * rows + j of the pattern's partial buffers.
  struct View {
    int32_t first_head = 0, heads = 0, head_step = 1;
    int64_t p0_step = 0, p0 = 0, rows = 0;
    size_t segment_begin = 0, segment_count = 0;
    int64_t partial_row = 0;
  };
  struct PatternState {
    Pattern pattern;
    PatternPlan plan;
    bool strided = false;
    std::vector<View> views;  // strided only
    int64_t nq = 0, nk = 0;   // gathered: rows per head of the gathered buffers
    int64_t partial_rows = 0; // rows per batch entry of the partial O and row stats
    int64_t pairs = 0;        // (query, key) pairs per batch entry on this rank
    std::vector<attncore::Segment> host_segments;
    const attncore::Segment* segments = nullptr;
    // Device tables (gathered patterns unless noted), -1 where there is nothing:
    const int32_t* q_src = nullptr;     // [heads_q * nq] gathered query row -> local Q row
    const int32_t* stat_src = nullptr;  // [partial_rows] partial row -> local LSE index (also strided, r > 1)
    const int32_t* kv_src = nullptr;    // [heads_q * nk] gathered key row -> local K row
    const int32_t* q_dst = nullptr;     // [local * heads_q] local Q row -> its partial row (every pattern)
    const int32_t* kv_dst = nullptr;    // [local * heads_kv * group] local K row -> its gathered rows
    std::vector<Message> sends, recvs;
  };
  // Buffers of one pass (attncore/plugin/workspace.h).
  struct PatternBuffers {
    void *q = nullptr, *k = nullptr, *v = nullptr, *d_o = nullptr;  // dtype, gathered
    float *o = nullptr, *lse = nullptr, *delta = nullptr;           // fp32 partial O and row stats (strided
                                                                    // backward, r = 1: none, the local ones serve)
    float *dq = nullptr, *dk = nullptr, *dv = nullptr;              // fp32 gathered gradients
    float* part_lse = nullptr;  // torchscale backward: LSE_i of the recomputed partial
    std::vector<char*> send, recv, grad_send, grad_recv;            // per message
  };
  struct Work {
    float *delta = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;  // backward: [B, H, local] and accumulators
    std::vector<PatternBuffers> patterns;
  };
  void build_tables(const Geometry& geometry);
  // Whether pattern st can run strided on this rank, and if so its views, segments and partial_rows.
  bool plan_views(PatternState& st, int64_t a0) const;
  Work layout(attncore::plugin::Carver& c, attncore::plugin::Pass pass) const;

  // The streams patterns run on at once (see .cpp): the compute stream first; not the one that
  // carries the exchanges where ranks exchange rows; only the compute stream when overlap is off.
  std::vector<void*> lanes() const;
  void exchange_kv(const void* k, const void* v, const Work& w, void* stream);
  // The return of the remote patterns' dK/dV partials to the ranks that own the keys, in two
  // halves: packed and exchanged on the communication stream once those patterns are done, and
  // added into the local accumulators on the compute stream once the exchange is.
  void send_gradients(const Work& w, void* compute, void* comm);
  void add_gradients(const Work& w, void* compute, void* comm);
  // The order patterns run in, both passes, and the lane (an index of lanes()) each runs on in
  // each pass (see .cpp): made once with the tables, in schedule_.
  struct Schedule {
    std::vector<size_t> first, remote, rest;
    std::vector<int> forward_lane, backward_lane;  // per pattern
  };
  Schedule schedule() const;
  template <class F>
  void run_patterns(const std::vector<size_t>& list, const char* pass, const std::vector<void*>& lanes,
                    const std::vector<int>& lane, F&& f);
  void pattern_forward(size_t p, const attnhost_forward_args& a, const PatternBuffers& b, void* stream);
  void pattern_backward(size_t p, const attnhost_backward_args& a, const Work& w, void* stream);
  void compute_delta(int32_t heads, int64_t seqlen, const attncore::TensorRef& o, bool o_fp32,
                     const attncore::TensorRef& d_o, const attncore::RowStatsRef& delta, void* stream,
                     float* zero = nullptr, size_t zero_bytes = 0);
  std::vector<RowCopy> stats_gather(const PatternState& st, const PatternBuffers& b, const attnhost_backward_args& a,
                                    const Work& w) const;
  attncore::ForwardParams forward_base() const;  // dtype, shape, scale, mask, fp32 partial O
  void view_forward(const PatternState& st, const View& v, const void* q, const void* k, const void* vv, float* o,
                    float* lse, void* stream);
  attncore::ForwardParams gathered_params(const PatternState& st, const void* q, const void* k, const void* v,
                                          float* o, float* lse) const;

  attncore::TensorRef local_ref(const void* base, int32_t heads) const;  // [B, local, heads, D]
  // The local [B, local, heads, D] tensor (elements of `bytes`) as a view's [B, rows, heads, D],
  // from head `first` (kv heads: first_head / group).
  attncore::TensorRef view_ref(const void* base, int32_t heads, size_t bytes, const View& v, int32_t first,
                               int64_t r) const;
  // A strided pattern's fp32 partial O [B, rows, D] and row stats [B, rows] as a view's.
  attncore::TensorRef partial_ref(float* base, int64_t rows, const View& v) const;
  attncore::RowStatsRef partial_stats(const float* base, int64_t rows, const View& v) const;
  // The local row stats [B, heads_q, local] as a view's (r = 1: its rows are consecutive tokens).
  attncore::RowStatsRef local_stats(const float* base, const View& v) const;
  attncore::TensorRef rows_ref(const void* base, int64_t n) const;       // [B, heads_q * n, 1, D]
  attncore::RowStatsRef local_stats(const float* base) const;                      // [B, heads_q, local]
  attncore::RowStatsRef rows_stats(const float* base, int64_t n) const;            // [B, 1, heads_q * n]
  size_t el() const { return attnhost::dtype_size(s_.dtype); }

  Shape s_;
  attnhost::Host host_;
  int rank_;
  bool overlap_, causal_;
  int64_t local_;  // tokens per rank (padded)
  int32_t group_;  // query heads per kv head
  attncore::DType dtype_;
  std::unique_ptr<attncore::plugin::Engine> engine_;
  std::unique_ptr<RowOps> ops_;
  std::vector<PatternState> patterns_;
  bool exchanges_ = false;  // some pattern sends or receives rows
  // The strided pattern whose views hold every local key, if any: the first to run, it writes the
  // local dK/dV accumulators (write_dkdv) instead of adding into zeroed ones. -1: none.
  int dkdv_writer_ = -1;
  Schedule schedule_;
  int64_t rank_pairs_ = 0;
  attnhost::HostBuffer tables_;  // every table and segment list, on the instance's device
  attncore::plugin::Workspace<Work> work_;
};

}  // namespace dilated
