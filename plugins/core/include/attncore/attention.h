// attncore: the attention operations every built-in attnhost plugin is made of.
//
// One plain parameter struct per operation (FlashAttention's Flash_fwd_params, made smaller); the
// same struct drives the CUDA kernels (attncore/cuda.h) and the CPU reference (attncore/cpu.h), so a
// plugin's CPU path and CUDA path are one schedule with two back ends.
//
// Conventions
//  - Tensors are [batch, token, head, dim] with `dim` contiguous (stride 1) and the other three
//    strides given in elements. Packed variable-length tensors use batch = 1 and segments.
//  - Positions: row i of a call has global position q_pos0 + i, column j has kv_pos0 + j (within a
//    segment: seg.q_pos0 + (i - seg.q_begin)). Masks are evaluated on global positions, so a ring
//    step that attends a remote K/V block gets the right causal/window mask from offsets alone.
//  - Mask: key j is visible to query i iff (!causal || j <= i) and (window_left < 0 || j >= i - window_left)
//    and (window_right < 0 || j <= i + window_right).
//  - LSE is the natural log of sum(exp(scale * q.k)) over visible keys, fp32; -inf for a row that
//    sees no key, whose output is 0 (never NaN) and whose gradients are 0.
//  - GQA: query head h reads key/value head h / (heads_q / heads_kv).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace attncore {

// Values equal attnhost_dtype's, so a plugin can cast. The FP8 formats (OCP e4m3 and e5m2) are
// inputs only: a call in FP8 reads Q, K, V and dO in it, each times its tensor's descale (the
// params' descale_*), and writes its outputs in output_dtype.
// `invalid` (4.0) marks a type not given (BackwardParams::dtype_do).
enum class DType : int32_t { invalid = 0, bf16 = 1, fp16 = 2, fp32 = 3, fp64 = 4, fp8_e4m3 = 8, fp8_e5m2 = 9 };

inline int dtype_bytes(DType t) {
  return t == DType::fp64 ? 8 : t == DType::fp32 ? 4 : t == DType::fp8_e4m3 || t == DType::fp8_e5m2 ? 1 : 2;
}
inline bool is_fp8(DType t) { return t == DType::fp8_e4m3 || t == DType::fp8_e5m2; }
// The type a call of input type `t` writes O, and dK and dV with write_dkdv, in.
inline DType output_dtype(DType t) { return is_fp8(t) ? DType::bf16 : t; }

// A [batch, token, head, dim] view with dim contiguous.
struct TensorRef {
  void* data = nullptr;
  int64_t batch_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

// A [batch, head, token] fp32 view with token contiguous (LSE, delta).
struct RowStatsRef {
  float* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
};

struct Mask {
  bool causal = false;
  int64_t window_left = -1;  // -1: unbounded
  int64_t window_right = -1; // -1: unbounded
  int64_t q_pos0 = 0;        // global position of row 0 (when there are no segments)
  int64_t kv_pos0 = 0;       // global position of column 0 (when there are no segments)
};

// Variable length: rows [q_begin, q_end) attend only columns [kv_begin, kv_end) of the same segment.
// A row belongs to at most one segment of a call; rows in no segment are left untouched.
struct Segment {
  int32_t q_begin, q_end;
  int32_t kv_begin, kv_end;
  int64_t q_pos0;  // global position of row q_begin
  int64_t kv_pos0; // global position of column kv_begin
};

// Block-sparse visiting order: for each (head, query block) the key blocks to visit, CSR.
// Blocks not listed cost nothing. masked[k] = 1 when block k needs element masking (a causal or
// window edge); 0 when every pair in it is visible. Block sizes are 64 or 128.
struct BlockList {
  int32_t block_q = 128;
  int32_t block_kv = 128;
  int32_t num_q_blocks = 0;
  int32_t heads = 1;                 // 1: shared by every query head; else heads_q
  const int32_t* row_ptr = nullptr;  // [heads * num_q_blocks + 1]
  const int32_t* kv_block = nullptr; // [row_ptr[last]]
  const uint8_t* masked = nullptr;   // [row_ptr[last]]
  // Appended: the same list by key block (CSC), which the CUDA backward walks (one CTA per key
  // block). make_block_list (attncore/block_list.h) fills both from one description.
  int32_t num_kv_blocks = 0;
  const int32_t* col_ptr = nullptr;  // [heads * num_kv_blocks + 1]
  const int32_t* q_block = nullptr;  // [col_ptr[last]]
  const uint8_t* q_masked = nullptr; // [col_ptr[last]]
  // Appended: how the CUDA backward shares out long key columns (a sink or global key block that
  // every query block reads would otherwise be one CTA's walk while the rest of the GPU idles).
  // Each piece is four int32: {key group, first query block, end query block, slot}. A key group is
  // kPieceKeys keys (group g: keys [g kPieceKeys, (g + 1) kPieceKeys)); a group's pieces cut its
  // query blocks into consecutive ranges, and a CTA walks one range of one group's columns. A
  // group of one piece has slot -1; the pieces of a group cut in several share a slot in
  // [0, num_split_groups), where a call that writes dK and dV (write_dkdv) adds them up first
  // (backward_workspace_bytes). make_block_list fills them; none (num_pieces 0): a CTA a key tile.
  // The CPU and the mma.sync kernels walk whole columns and ignore them.
  // The pieces' own CSC, walked as the CSC above: column (h, i, c), at h num_pieces C + i C + c
  // with C = kPieceKeys / block_kv (1 or 2), holds head h's entries of column c of piece i's group
  // that lie in its query blocks.
  int32_t num_pieces = 0;
  const int32_t* pieces = nullptr;         // [num_pieces][4]
  int32_t num_split_groups = 0;
  const int32_t* piece_col_ptr = nullptr;  // [heads * num_pieces * C + 1]
  const int32_t* piece_q_block = nullptr;  // [piece_col_ptr[last]]
  const uint8_t* piece_q_masked = nullptr; // [piece_col_ptr[last]]
};

// The keys of a block list's key group (BlockList::pieces): a multiple of every key tile's width.
constexpr int32_t kPieceKeys = 128;

struct ForwardParams {
  DType dtype = DType::bf16;          // Q, K, V (and O unless o_fp32)
  int32_t batch = 1, heads_q = 1, heads_kv = 1, head_dim = 128;
  int64_t seqlen_q = 0, seqlen_kv = 0; // rows and columns of this call
  float softmax_scale = 0.f;
  TensorRef q, k, v;
  TensorRef o;        // output: dtype, or fp32 when o_fp32 (a partial to be merged)
  bool o_fp32 = false;
  RowStatsRef lse;    // output
  Mask mask;
  const Segment* segments = nullptr; // device memory for CUDA calls, host memory for CPU calls
  int32_t num_segments = 0;
  const BlockList* blocks = nullptr; // pointers inside live where segments live
  // Appended. FP8 inputs: what an element of Q, K and V stands for per unit (1: not FP8).
  float descale_q = 1.f, descale_k = 1.f, descale_v = 1.f;
  // Appended (3.0: the struct grew). Device memory for an FP8 forward on CUDA, which writes V
  // with its keys contiguous here (the FP8 products read both operands K-major): at least
  // forward_workspace_bytes(*this) bytes. Nothing is kept between calls.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Appended (10.0). A partial output of the same rows over other keys, O in fp32 and its LSE,
  // merged in as MergeParams merges: o and lse receive the output over both key sets, with no merge
  // pass after the call. o and lse may be o_prior and lse_prior themselves (in place; o then in
  // fp32), else must not overlap them. Rows the call does not write (outside every segment) are not
  // merged. Null o_prior.data: none. The native kernels and the CPU merge; the cuDNN engine does not
  // serve such a call.
  TensorRef o_prior;
  RowStatsRef lse_prior;
};

// The workspace a forward call on CUDA needs (ForwardParams::workspace): 0 unless its inputs are FP8.
size_t forward_workspace_bytes(const ForwardParams& p);

struct BackwardParams {
  DType dtype = DType::bf16;
  int32_t batch = 1, heads_q = 1, heads_kv = 1, head_dim = 128;
  int64_t seqlen_q = 0, seqlen_kv = 0;
  float softmax_scale = 0.f;
  TensorRef q, k, v, d_o;  // dtype
  RowStatsRef lse;         // of the final output (exact for ring and dilated)
  RowStatsRef delta;       // rowsum(dO * O_final), from compute_delta
  TensorRef dq, dk, dv;    // fp32 accumulators: the call adds its contribution
  Mask mask;
  const Segment* segments = nullptr;
  int32_t num_segments = 0;
  const BlockList* blocks = nullptr;
  bool deterministic = false; // bitwise reproducible dq/dk/dv
  // Appended for the cuDNN engine (attncore/cudnn.h). The final output O in `dtype`, as the forward
  // wrote it: cuDNN's graph recomputes delta from dO and O itself. The native kernels and the CPU
  // read `delta` and ignore this; a null `o.data` makes the call one cuDNN does not serve.
  TensorRef o;
  // Appended. false (the core's contract): dq/dk/dv are fp32 accumulators the call adds into.
  // true: the call writes this call's gradients into dq/dk/dv in `dtype`, overwriting them: for a
  // call that is the whole problem, as frameworks do. Only the cuDNN engine writes; the native
  // kernels and the CPU reject it.
  bool write_grads = false;
  // Appended. true: dk and dv are written in `dtype` (overwritten) instead of added into fp32
  // accumulators; dq stays an fp32 accumulator. For a call that alone makes the gradients of its
  // keys (seqlen_q > 0): no zeroing, no conversion and no atomics for dK and dV; keys no query sees
  // get zeros. Without segments that is every key; with segments, every key of a segment (keys in
  // no segment are not written), and segments must not share keys. The native kernels and the CPU
  // write; the cuDNN engine does not serve such a call.
  bool write_dkdv = false;
  // Appended. With write_dkdv: dk and dv are fp32 tensors, written in fp32. For a call whose keys'
  // gradients other calls add to afterwards (dilated's patterns): no zeroing before it.
  bool write_dkdv_fp32 = false;
  // Appended. Device memory for a CUDA call that writes dK and dV (write_dkdv) with a block list
  // whose long key columns are cut in pieces: their partial gradients are added up here before the
  // call writes them. At least backward_workspace_bytes(*this) bytes, or the call walks whole
  // columns instead. The call clears what it uses; nothing is kept between calls. An FP8 call on
  // CUDA (3.1) needs it: its Q, K, V and dO are widened to bf16 here first (with e4m3 products, Q
  // alone, beside dO transposed). A plain call without a causal mask (11.1) sums the parts of its
  // last wave's key tiles here where it has room.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Appended. FP8 inputs: what an element of Q, K, V and dO stands for per unit (1: not FP8). The
  // outputs written in a dtype (write_dkdv, write_grads) take output_dtype(dtype).
  float descale_q = 1.f, descale_k = 1.f, descale_v = 1.f, descale_do = 1.f;
  // Appended (4.0). dO's type where it is not `dtype`: fp8_e5m2 beside e4m3 Q, K and V (the hybrid
  // FP8 recipe, gradients in the format of wider range). invalid: dtype. See check_supported_do.
  DType dtype_do = DType::invalid;
  // Appended (8.0). With write_dkdv: fp32 gradients that other calls made of keys
  // [add_begin, add_end) of this call (their rows of dk_add and dv_add, laid out as dk and dv are),
  // added to this call's before dK and dV are written, in one rounding: the sum a ring's owner of a
  // block writes once the other ranks' shares of it are home. Null data: nothing added.
  TensorRef dk_add, dv_add;
  int64_t add_begin = 0, add_end = 0;
  // Appended (11.0). Where data is set, the call also writes dQ, rounded to output_dtype(dtype),
  // into dq_out ([batch, seqlen_q, heads_q, head_dim], laid out as its strides say): what the fp32
  // accumulator dq holds once the call's adds are in (with whatever it held before), as
  // convert_cuda / cpu::convert would write it (dq_out_conversion). For the call that ends a backward, as frameworks
  // take dQ. The Hopper FP8 backward with e4m3 products rounds each query head's rows in the CTA
  // that adds last into them, while the others still run, where each CTA adds into one query head
  // and the workspace has backward_workspace_bytes(*this) bytes (its counters); elsewhere a pass
  // after the call does it.
  TensorRef dq_out;
};
// The type dO is read in.
inline DType do_dtype(const BackwardParams& p) { return p.dtype_do == DType::invalid ? p.dtype : p.dtype_do; }
// Empty when a backward of `dtype` inputs takes dO in `dtype_do` (invalid: dtype) on every back end
// that takes `dtype`, else one line: the only mix is e5m2 dO with e4m3 Q, K and V (4.0).
std::string check_supported_do(DType dtype, DType dtype_do);
// Empty when a backward's dk_add and dv_add (8.0) are both set or both null and, set, go with
// write_dkdv and no block list, over keys within the call's; else one line.
std::string check_grad_addend(const BackwardParams& p);

// The workspace a backward call can use (BackwardParams::workspace): 0 unless it writes dK and dV
// under a block list with split key groups, its inputs are FP8, it writes dq_out (11.0: a
// counter a query head), or (11.1) it is a plain call without a causal mask or window, whose
// Hopper backward may cut its last wave's key tiles in parts and sum their dK and dV there (8 MiB;
// with less, the tiles stay whole).
size_t backward_workspace_bytes(const BackwardParams& p);

// Empty when the core's CUDA kernels support the configuration, forward and backward, else one line
// naming what is supported. FP8 (3.1): e4m3 at head dims 64, 128 and 256; its forward runs on
// Hopper, its backward with S^T, dP^T and dV's products in e4m3 where it can (Hopper, head dim 128,
// e4m3 dO, long plain calls; not on ATTNCORE_FP8_PRODUCTS=0), else on the bf16 kernels after
// widening the inputs (so on any device they serve).
std::string check_supported(DType dtype, int32_t head_dim);
// The same for a forward alone (3.0); since 3.1 it answers as check_supported.
std::string check_supported_forward(DType dtype, int32_t head_dim);

// ---- Appended below: the operations around the attention kernels, and their conventions ----
//
// Where things live. For a CUDA call every data pointer (tensors, row stats, segments, the arrays
// inside a BlockList) is device memory, while the BlockList struct itself is read on the host; for
// a CPU call everything is host memory. Block lists: each row of the CSR (and column of the CSC)
// is sorted ascending without duplicates; a listed block is visited once. Block lists cannot be
// combined with segments. When a block list is given, key j is visible to row i iff j's block is
// listed for i's block, j < seqlen_kv, and (the entry is not masked or the Mask admits (i, j)).
//
// softmax_scale 0 means 1/sqrt(head_dim); a given scale must be positive.
//
// Errors: every operation (CPU and CUDA) throws attncore::Error, a std::runtime_error with a
// one-line message, for an unsupported or malformed call; the CUDA ones also for a failed launch.

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d] in fp32: the row term of the softmax
// gradient, computed from the final output.
struct DeltaParams {
  DType dtype = DType::bf16; // dO, and O (in output_dtype) unless o_fp32
  int32_t batch = 1, heads = 1, head_dim = 128;
  int64_t seqlen = 0;
  TensorRef o, d_o;
  bool o_fp32 = false;
  RowStatsRef delta; // output
  // Optional: zero_bytes bytes at `zero` set to 0 in the same pass, where the backward's fp32 dQ
  // accumulator is usually cleared (as FlashAttention-3's preprocessing kernel does): its stores
  // go out while the pass waits on its loads, instead of in a pass of their own.
  void* zero = nullptr;
  size_t zero_bytes = 0;
  float descale_do = 1.f;  // appended: FP8 dO, what an element stands for per unit
};

// In place, fp32: (o_acc, lse_acc) <- merge((o_acc, lse_acc), (o_part, lse_part)) with
//   lse = logaddexp(lse_acc, lse_part), o = exp(lse_acc - lse) o_acc + exp(lse_part - lse) o_part.
// A side whose LSE is -inf weighs 0; two empty sides stay (0, -inf). An accumulator starts as
// (0, -inf), or is simply the first partial.
struct MergeParams {
  int32_t batch = 1, heads = 1, head_dim = 128;
  int64_t seqlen = 0;
  TensorRef o_acc;      // fp32, in/out
  RowStatsRef lse_acc;  // in/out
  TensorRef o_part;     // fp32
  RowStatsRef lse_part;
  // (7.0) The last merge on its rows: o goes rounded to out_dtype (bf16 or fp16) into
  // o_out, not back into o_acc (whose rows then hold anything), so that no conversion pass follows.
  // Data null: o_acc in fp32, as before.
  TensorRef o_out;
  DType out_dtype = DType::bf16;
};

// dst = src (+ add) rounded to dtype (round to nearest even): a merged fp32 output, or fp32
// gradient accumulators, turned into the output dtype once at the end. `add` (5.0; data null: none)
// is a second fp32 tensor summed in first, so that partial sums meet in the same pass: ring
// gradients arriving home, allgather's partials from a peer. With dtype fp32, dst may be src
// (in place); else dst must not overlap src or add.
struct ConvertParams {
  DType dtype = DType::bf16; // of dst; src is fp32
  int32_t batch = 1, heads = 1, head_dim = 128;
  int64_t seqlen = 0;
  TensorRef src, dst;
  TensorRef add;
};

// The pass that writes a backward's dq_out (11.0) from its dq, where its kernels do not.
inline ConvertParams dq_out_conversion(const BackwardParams& p) {
  ConvertParams c;
  c.dtype = output_dtype(p.dtype);
  c.batch = p.batch;
  c.heads = p.heads_q;
  c.head_dim = p.head_dim;
  c.seqlen = p.seqlen_q;
  c.src = p.dq;
  c.dst = p.dq_out;
  return c;
}

// Appended (3.1). *amax = max |x| over a [batch, seqlen, heads, head_dim] tensor in dtype (bf16,
// fp16 or fp32): an FP8 step's output statistic (attnhost_fp8_amax). NaN elements are skipped (rows
// a caller never wrote may hold them); 0 for an empty tensor. amax is fp32, in device memory for a
// CUDA call.
struct AmaxParams {
  DType dtype = DType::bf16;
  int32_t batch = 1, heads = 1, head_dim = 128;
  int64_t seqlen = 0;
  TensorRef x;
  float* amax = nullptr;
};

// The CPU reference takes any head_dim >= 1 and bf16, fp16, fp32 or FP8 inputs.
std::string check_supported_cpu(DType dtype, int32_t head_dim);

} // namespace attncore
