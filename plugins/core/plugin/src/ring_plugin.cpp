#include "attncore/plugin/ring_plugin.h"

#include "calls.h"
#if ATTNCORE_HAVE_CUDA
#include "attncore/cuda.h"
#endif

namespace attncore::plugin {

void validate_dense(const attnhost::Problem& p) {
  using attnhost::fail;
  if (p.packed()) fail(ATTNHOST_ERR_UNSUPPORTED, "packed variable-length input is the varlen plugin's");
  validate_packed(p);
}

void validate_packed(const attnhost::Problem& p) {
  using attnhost::fail;
  if (p.packed()) {
    const std::vector<int64_t>& cu = p.cu_seqlens_q();
    if (cu.empty() || cu != p.cu_seqlens_kv())
      fail(ATTNHOST_ERR_UNSUPPORTED, "packed documents need the same lengths for queries and keys");
    for (size_t d = 1; d < cu.size(); ++d)
      if (cu[d] < cu[d - 1]) fail(ATTNHOST_ERR_INVALID_ARGUMENT, "cu_seqlens must not decrease");
    if (cu.front() != 0 || cu.back() != p->seqlen_q)
      fail(ATTNHOST_ERR_INVALID_ARGUMENT, "cu_seqlens must run from 0 to seqlen (" + std::to_string(p->seqlen_q) + ")");
  }
  if (p->seqlen_q != p->seqlen_kv)
    fail(ATTNHOST_ERR_UNSUPPORTED, "seqlen_kv (" + std::to_string(p->seqlen_kv) + ") must equal seqlen_q (" +
                                       std::to_string(p->seqlen_q) + "): self-attention only");
  if (p->heads_kv <= 0 || p->heads_q % p->heads_kv != 0)
    fail(ATTNHOST_ERR_INVALID_ARGUMENT, "heads_q must be a multiple of heads_kv");
  const DType dtype = core_dtype(p->dtype);
  const std::string why = p->device_type == ATTNHOST_DEVICE_CUDA ? check_supported(dtype, p->head_dim)
                                                                 : check_supported_cpu(dtype, p->head_dim);
  if (!why.empty()) fail(ATTNHOST_ERR_UNSUPPORTED, why);
  if (p->grad_dtype != 0)  // (0 from a host before ABI 1.6)
    if (std::string d_o = check_supported_do(dtype, core_dtype(p->grad_dtype)); !d_o.empty())
      fail(ATTNHOST_ERR_UNSUPPORTED, d_o);
#if ATTNCORE_HAVE_CUDA
  // FP8 runs on the Hopper kernels alone: refused here rather than at the first forward.
  if (p->device_type == ATTNHOST_DEVICE_CUDA && is_fp8(dtype) && std::string(native_kernels()) != "wgmma")
    fail(ATTNHOST_ERR_UNSUPPORTED, "attncore: FP8 on CUDA runs on the Hopper kernels only (an sm_90a build on a Hopper "
                                   "GPU, ATTNCORE_KERNELS not mma)");
#endif
  if (p->device_type == ATTNHOST_DEVICE_CUDA && !(kRingDevices & ATTNHOST_CAP_DEVICE_CUDA))
    fail(ATTNHOST_ERR_UNSUPPORTED, "this plugin was built without CUDA");
}

DenseMask dense_mask(const attnhost::Problem& p) {
  DenseMask m;
  m.seqlen = p->seqlen_q;
  m.causal = p->causal != 0;
  m.window_left = p->window_left;
  m.window_right = p->window_right;
  return m;
}

RingShape dense_shape(const attnhost::Problem& p, int64_t local_tokens) {
  RingShape s;
  s.dtype = p->dtype;
  s.batch = static_cast<int32_t>(p->batch);
  s.heads_q = p->heads_q;
  s.heads_kv = p->heads_kv;
  s.head_dim = p->head_dim;
  s.local_q = s.local_kv = local_tokens;
  s.softmax_scale = static_cast<float>(p->softmax_scale);
  s.mask = dense_mask(p);
  s.deterministic = p->deterministic != 0;
  return s;
}

namespace {

// A slice's backward CTAs over a rank's keys (RingShape's largest slice).
int64_t backward_ctas(const RingShape& s) {
  const auto slice = [](int64_t n, int64_t slices) { return (n + slices - 1) / slices; };
  return slice(s.local_kv, 128) * slice(s.heads_kv, s.head_slices) * slice(s.batch, s.batch_slices);
}

// Packed head slices keep one row set: their prologue runs between their pack and their call.
bool wants_double_rows(const RingShape& s) { return s.batch_slices > 1 && s.head_slices == 1; }

// False when no count it may take meets the rule (it then takes the most it may).
bool choose_slice_counts(RingShape& s, int world_size, int64_t min_ctas) {
  const bool auto_batch = s.batch_slices <= 0, auto_heads = s.head_slices <= 0;
  s.forward_batch_slices = auto_batch ? 0 : s.batch_slices;  // asked for: both passes
  if (auto_batch) s.batch_slices = 1;
  if (auto_heads) s.head_slices = 1;
  if (world_size == 1 || (!auto_batch && !auto_heads)) return true;
  // Inputs (Q, dO, K, V, and the blocks) in the problem's dtype, outputs in theirs (bf16 for FP8).
  const double in = static_cast<double>(elem_size(s, Elem::input)), out = static_cast<double>(elem_size(s, Elem::output));
  const double q_elems = double(s.batch) * s.local_q * s.heads_q * s.head_dim;
  const double kv_elems = double(s.batch) * s.local_kv * s.heads_kv * s.head_dim;
  const double q = q_elems * (in + out) / 2, kv = kv_elems * (in + out) / 2;  // per tensor, on average
  const double lse = double(s.batch) * s.heads_q * s.local_q * 4;
  const double working_set = 4 * q + 4 * kv + 4 * kv_elems * in;  // Q O dO dQ, K V dK dV, two K/V blocks
  const auto fits = [&] {
    RingShape t = s;
    t.double_rows = wants_double_rows(t);
    t.own_last = s.own_last && t.double_rows;
    return 4 * q + 4 * kv + lse + double(RingAttention::workspace_bytes(t, world_size)) <= 1.3 * working_set;
  };
  if (fits()) return true;
  // One more slice of `count` (of `total`), unless it would starve the backward's grid; then no
  // more slices of any kind.
  bool starved = false;
  const auto more = [&](int32_t& count, int32_t total) {
    if (starved || count >= total) return false;
    ++count;
    if (backward_ctas(s) >= min_ctas) return true;
    --count;
    starved = true;
    return false;
  };
  if (auto_batch)
    while (more(s.batch_slices, s.batch))
      if (fits()) return true;
  if (auto_heads)
    while (more(s.head_slices, s.heads_kv))
      if (fits()) return true;
  return false;
}

}  // namespace

void choose_slices(RingShape& s, int world_size, int64_t min_ctas) {
  // own_last's third row set may cost one batch slice more than the travelling backward takes: at
  // xlarge on two H200s (B=8, 16384 tokens a rank) own_last in four slices ran 229.5 / 228.6 ms
  // fwd+bwd, on 13.5 GiB a rank, against the travelling backward's three, 232.0 / 231.4 on 15.5 GiB
  // (docs/KERNELS.md, "Shares home, own block last"). Not head slices (own_last needs the batch's),
  // nor more batch slices than that: untimed (GQA, whose row sets outgrow its K/V).
  RingShape travelling = s;
  travelling.own_last = false;
  choose_slice_counts(travelling, world_size, min_ctas);
  RingShape t = s;
  const bool own_last = s.own_last && choose_slice_counts(t, world_size, min_ctas) && wants_double_rows(t) &&
                        t.head_slices == travelling.head_slices && t.batch_slices <= travelling.batch_slices + 1;
  s = own_last ? t : travelling;
  s.double_rows = wants_double_rows(s);
  s.own_last = s.own_last && s.double_rows;
}

void choose_slices(RingShape& s, int world_size) { choose_slices(s, world_size, 0); }

}  // namespace attncore::plugin
