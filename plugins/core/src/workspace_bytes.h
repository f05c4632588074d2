// How a backward call's workspace (BackwardParams::workspace) is laid out: the fp32 sums of a block
// list's split key groups first (cuda/pieces.cu), or those of the Hopper backward's last wave in
// parts (cuda/cta_order.h; plain calls without a causal mask), then, for FP8 inputs on CUDA, Q, dO,
// K and V widened to bf16 (cuda/fp8_inputs.cu), each tensor packed and on a 256-byte boundary, then, for a
// call that writes dq_out, a counter a (batch, query head) (the Hopper backward's). (The backward
// with e4m3 products widens Q only and writes dO^T, one byte an element, in dO's slot.)
#pragma once

#include <cstddef>
#include <cstdint>

#include "attncore/attention.h"
#include "cuda/cta_order.h"

namespace attncore {

inline size_t workspace_align(size_t n) { return (n + 255) / 256 * 256; }

// The last wave's parts (cuda/cta_order.h, TailSplit): kMaxTailTiles x 8 counters (2 KiB), then a
// slot a tail tile holding its eight consumer warps' dK and dV fragments in fp32, at most 128
// floats a lane.
// For plain calls without a causal mask (whose CTAs are alike: a causal call orders its tiles
// heaviest first instead).
constexpr size_t kTailWarps = 8, kTailSlotFloats = kTailWarps * 32 * 128;
inline bool tail_call(const BackwardParams& p) {
  return !p.blocks && p.num_segments == 0 && !p.mask.causal && p.mask.window_left < 0 && p.mask.window_right < 0;
}
inline size_t tail_sums_bytes(const BackwardParams& p) {
  return tail_call(p) ? size_t(cuda::kMaxTailTiles) * (kTailSlotFloats * sizeof(float) + kTailWarps * sizeof(int32_t))
                      : 0;
}
// The split key groups' fp32 sums (block lists cut in pieces, written dK and dV).
inline size_t split_sums_bytes(const BackwardParams& p) {
  if (!p.write_dkdv || !p.blocks || p.blocks->num_split_groups <= 0) return 0;
  return 2 * size_t(p.blocks->num_split_groups) * size_t(p.batch) * size_t(p.heads_kv) * kPieceKeys *
         size_t(p.head_dim) * sizeof(float);
}
// Where the tail's counters and sums lie in p's workspace: its start (a call with a tail has no
// block list, so no split groups); null where it has no room.
inline float* tail_sums(const BackwardParams& p) {
  const size_t bytes = tail_sums_bytes(p);
  if (bytes == 0 || !p.workspace || p.workspace_bytes < bytes) return nullptr;
  return static_cast<float*>(p.workspace);
}

// One widened tensor: [batch, tokens, heads, head_dim] bf16.
inline size_t widened_tensor_bytes(const BackwardParams& p, int64_t tokens, int32_t heads) {
  return workspace_align(size_t(p.batch) * size_t(tokens) * size_t(heads) * size_t(p.head_dim) * 2);
}

// All four, in the order Q, dO, K, V (0 unless the inputs are FP8).
inline size_t widened_inputs_bytes(const BackwardParams& p) {
  if (!is_fp8(p.dtype)) return 0;
  return 2 * widened_tensor_bytes(p, p.seqlen_q, p.heads_q) + 2 * widened_tensor_bytes(p, p.seqlen_kv, p.heads_kv);
}

// The counters of a call that writes dq_out: an int32 a (batch, query head), last in the workspace.
inline size_t dq_counters_bytes(const BackwardParams& p) {
  return p.dq_out.data ? size_t(p.batch) * size_t(p.heads_q) * sizeof(int32_t) : 0;
}
// Where they lie in p's workspace; null where it has not backward_workspace_bytes(p) bytes.
inline int32_t* dq_counters(const BackwardParams& p) {
  const size_t need = backward_workspace_bytes(p);
  if (!p.dq_out.data || !p.workspace || p.workspace_bytes < need) return nullptr;
  return reinterpret_cast<int32_t*>(static_cast<char*>(p.workspace) + (need - dq_counters_bytes(p)));
}

} // namespace attncore
