// What the ring and routed schedules share: views of a rank's local tensors, the core's
// parameters for one BlockCall, and the fp32 output that merges a row's partials. Internal to
// libattncore's plugin layer.
#pragma once

#include "attncore/plugin/ring.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace attncore::plugin {

// What a view's elements are: the problem's inputs (Q, K, V, dO, in its dtype), its outputs (O,
// dQ, dK, dV: the same type, but bf16 for FP8 inputs), or fp32 accumulators.
enum class Elem { input, output, fp32 };
size_t elem_size(const RingShape& s, Elem e);
int32_t output_dtype(const RingShape& s);  // the outputs' attnhost dtype

// [batch, local token, head, dim] views of one shape's local tensors (Q-like: local_q tokens,
// heads_q; K/V-like: local_kv tokens, heads_kv), and [batch, head, token] row statistics.
struct LocalViews {
  const RingShape& s;
  TensorRef q(void* base, int64_t row0, Elem e) const;
  TensorRef kv(void* base, int64_t col0, Elem e) const;
  RowStatsRef stats(float* base, int64_t row0) const;
  // The call's mask: the shape's causal/window when the call is masked, at the call's positions.
  Mask mask(const BlockCall& c) const;
};

// The core's parameters of call `c`: rows of q from c.q_begin, columns of k and v (the block in
// hand) from c.kv_begin, with an FP8 problem's descales (`fp8`, else null). The forward's o and
// lse are left for the caller.
ForwardParams forward_params(const RingShape& s, const BlockCall& c, void* q, void* k, void* v,
                             const attnhost_fp8_scaling* fp8);
// Gradients go to dq (rows from c.q_begin) and dk, dv (columns from c.kv_begin), all fp32. The
// segments are the call's backward ones (BlockCall::backward_segments); skip a call whose list is
// empty rather than passing it here (no segments would mean the whole rectangle).
BackwardParams backward_params(const RingShape& s, const BlockCall& c, const attnhost_backward_args& a, void* k,
                               void* v, float* delta, float* dq, float* dk, float* dv);

// Whether call `c` alone can make every local key's gradients, when it is a rank's only call and no
// other rank reads its keys: no segments, all local keys, some queries. Such a call writes dK and
// dV straight into the outputs (write_dkdv_into: in the problem's output dtype, or in fp32 where
// the shape's kv_grads_fp32 says so).
bool covers_all_keys(const RingShape& s, const BlockCall& c);
void write_dkdv_into(BackwardParams& p, const RingShape& s, const BlockCall& c, const attnhost_backward_args& a);

// Elements of a rank's Q-like and K/V-like tensors of shape `s`, and its rows of statistics (LSE,
// delta).
// dO's element type: the problem's, or e5m2 beside e4m3 inputs (ABI 1.6, the hybrid FP8 recipe).
inline int32_t d_o_dtype(const RingShape& s, const attnhost_backward_args& a) {
  return a.d_o.dtype != 0 ? a.d_o.dtype : s.dtype;
}

// *amax = max |x| of a local output tensor ([batch, tokens, heads, head dim] in the outputs'
// dtype), on `stream`: the whole tensor, whose rows a schedule writes all (zeros where no key is
// seen) or leaves as the host's NaN, which amax skips.
void output_amax(Engine& e, const RingShape& s, float* amax, const TensorRef& x, int64_t tokens, int32_t heads,
                 void* stream);
// Where an FP8 pass asks for it, the amax of what it wrote, once every output is home on `stream`:
// O after a forward, dQ, dK and dV after a backward (a rank's local_q and local_kv tokens of `s`).
void report_amax(Engine& e, const RingShape& s, const attnhost_forward_args& a, void* stream);
void report_amax(Engine& e, const RingShape& s, const attnhost_backward_args& a, void* stream);

struct LocalSizes {
  size_t q, kv, rows;
};
LocalSizes local_sizes(const RingShape& s);

// The row buffers of a pass of shape `s`.
RowBuffers take_row_buffers(Carver& c, Pass pass, const RingShape& s);

// delta = rowsum(dO * O) of the rank's local rows, from the final output a.o: the row term every
// backward call of the rank reads; and the fp32 dQ accumulator of those rows cleared in the same pass.
void compute_local_delta(const RingShape& s, Engine& engine, const attnhost_backward_args& a, float* delta, float* dq,
                         void* stream);
// The same over the local rows `rows` alone; dQ's accumulator (all of it) is cleared where `clear`.
void compute_local_delta(const RingShape& s, Engine& engine, const attnhost_backward_args& a, float* delta, float* dq,
                         Interval rows, bool clear, void* stream);

// fp32 src (a shape's Q-like or K/V-like tensor), plus fp32 `add` of the same layout where given, to
// the output dtype in dst.
void convert_out(const RingShape& s, Engine& engine, const float* src, void* dst, bool kv, void* stream,
                 const float* add = nullptr);
// The same for rows [rows.lo, rows.hi) of a Q-like tensor alone, into `dst`'s view from its first row.
void convert_rows_out(const RingShape& s, Engine& engine, const float* src, const TensorRef& dst, Interval rows,
                      void* stream);

// Whether a call is dense (no segments, no block list): it may be cut into rows or columns.
bool dense(const BlockCall& c);

// A forward call, and whether it alone reaches its rows: then it writes O in the problem dtype
// straight into the output, with no fp32 round trip and no merge.
struct OutputCall {
  BlockCall call;
  bool direct;
  bool last = false;  // no later call writes its rows: their merge is the last, rounded out as it goes
};
// A rank's calls, step by step, each with whether it writes directly and whether it is the last on
// its rows. A dense call (no segments, no block list) is cut where other calls' rows begin and end,
// so that the rows no other call reaches are written directly (a window's own block, but for the
// rows that reach the previous rank).
std::vector<std::vector<OutputCall>> output_calls(const std::vector<std::vector<BlockCall>>& steps);

// The forward's output. A direct call writes (O, LSE) in the final output; otherwise in fp32, where
// the first call on a row writes (O, LSE) and later calls merge into it: a dense call in its kernel
// (ForwardParams::o_prior) where the engine merges so, else (segments, a block list, a call cuDNN
// serves) by writing a partial that a merge pass adds in; the last merge on a row goes straight into
// the output in its dtype. finish() gives rows no call reached O = 0 and LSE = -inf, and converts
// the fp32 rows no merge rounded out to the output's dtype.
class OutputAccumulator {
 public:
  // The forward's row buffers (take_row_buffers); lse and o: the final output.
  OutputAccumulator(const RingShape& s, Engine& engine, const RowBuffers& rows, float* lse, void* o)
      : s_(s), engine_(engine), o_acc_(rows.o_acc), o_part_(rows.o_part), lse_part_(rows.lse_part), lse_(lse), o_(o) {}
  void run(ForwardParams p, const OutputCall& c, void* stream);
  void finish(void* stream);

 private:
  bool written(int64_t begin, int64_t end) const;  // all of [begin, end) or none (else a schedule bug)

  const RingShape& s_;
  Engine& engine_;
  float *o_acc_, *o_part_, *lse_part_, *lse_;
  void* o_;
  // Row ranges written in fp32, directly, and rounded out by their last merge.
  std::vector<std::pair<int64_t, int64_t>> rows_, direct_, rounded_;
};

}  // namespace attncore::plugin
