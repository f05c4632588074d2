// Kernel arguments: the public parameter structs, flattened into what a kernel reads by value.
#pragma once

#include <cstdint>

#include "attncore/attention.h"
#include "cta_order.h"
#include "tiles.cuh"

namespace attncore::cuda {

struct AttnArgs {
  TensorRef q, k, v, d_o, o; // o: forward output (dtype or fp32)
  RowStatsRef lse, delta;
  TensorRef dq, dk, dv;      // fp32 accumulators (backward); dk, dv written as dkdv_out says
  int32_t seqlen_q = 0, seqlen_kv = 0, heads_q = 1, group = 1;
  float scale = 0.f, scale_log2 = 0.f; // softmax scale, and times log2(e)
  bool o_fp32 = false;
  TensorRef o_prior;   // the forward's partial (O fp32, LSE) merged in (ForwardParams::o_prior); null: none
  RowStatsRef lse_prior;
  bool accumulate_dq = false; // dK/dV kernel also adds dQ (atomically)
  GradOut dkdv_out = GradOut::add_fp32; // BackwardParams::write_dkdv and write_dkdv_fp32
  MaskArgs mask;
  const Segment* segs = nullptr;
  int32_t nseg = 0;
  BlockArgs blocks; // heads == 0: no block list
  // The Hopper backward with a block list's long key columns shared out (blocks.pieces): where a
  // piece of a split group would write dK and dV, it adds its part into that group's fp32 sums
  // instead (split_dk, split_dv: the first slot's [batch][kv head][kPieceKeys][head dim] view, slot
  // s at s split_slot_stride floats further; null data: the call adds into accumulators, as every
  // CTA does).
  TensorRef split_dk, split_dv;
  int64_t split_slot_stride = 0;
  // Written dK and dV first take the fp32 shares other calls made of keys [add_begin, add_end)
  // (BackwardParams::dk_add; null data: none).
  TensorRef dk_add, dv_add;
  int32_t add_begin = 0, add_end = 0;
  // The Hopper backward's CTAs a (key tile, kv head): each walks group / head_splits of the kv
  // head's query heads, grid y being heads_kv x head_splits; above 1 they add dK and dV by atomics.
  int32_t head_splits = 1;
  // The Hopper backward's order of CTAs: 0, key tiles along x and runs of query heads along y; else
  // launch order (x then y) counts groups of this many runs, each group's key tiles heaviest first
  // with its runs side by side (sm90 cta_place, cta_order.h).
  int32_t tile_groups = 0;
  // The Hopper backward with FP8 products: dP^T = V dO^T comes out in units of descale_v descale_do,
  // dV's product in units of descale_do (S^T's descales ride in scale_log2); dp_scale also carries the
  // softmax scale where dS^T holds it (BackwardConfig::kScaleInDs).
  float dp_scale = 1.f, dv_scale = 1.f;
  // The Hopper backward that writes dQ rounded (BackwardParams::dq_out): each CTA counts in at
  // dq_done[batch x heads_q + its query head] as it ends, and the last of a head's CTAs, which one
  // call has gridDim.x of (ctas_of_line with a tail), rounds its rows into dq_out. Null dq_done: a
  // pass after the call does it.
  TensorRef dq_out;
  int32_t* dq_done = nullptr;
  // The Hopper backward's last wave in parts (cta_order.h, TailSplit; tail.parts 1: none): a
  // one-dimensional grid of tail.whole CTAs, then the tail's parts. Each part's warps add their
  // dK and dV into tail_sums (a tile's slot of its consumer warps' fragments, in fp32) and count
  // in at tail_done (a counter a warp of a slot); the last to count writes the sums (sm90
  // sum_tail_parts).
  TailSplit tail;
  float* tail_sums = nullptr;
  int32_t* tail_done = nullptr;
};

// Slot `slot` of a split group's sums (AttnArgs::split_dk, split_dv).
__host__ __device__ inline TensorRef split_slot(TensorRef sums, int32_t slot, int64_t slot_stride) {
  sums.data = static_cast<float*>(sums.data) + slot * slot_stride;
  return sums;
}

inline BlockArgs make_block_args(const BlockList* b) {
  BlockArgs a;
  if (!b) return a;
  a.block_q = b->block_q;
  a.block_kv = b->block_kv;
  a.num_q_blocks = b->num_q_blocks;
  a.num_kv_blocks = b->num_kv_blocks;
  a.heads = b->heads;
  a.row_ptr = b->row_ptr;
  a.kv_block = b->kv_block;
  a.masked = b->masked;
  a.col_ptr = b->col_ptr;
  a.q_block = b->q_block;
  a.q_masked = b->q_masked;
  return a;
}

// What a forward and a backward call have in common (their parameter structs share these names).
template <class Params> AttnArgs call_args(const Params& p) {
  AttnArgs a;
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.lse = p.lse;
  a.seqlen_q = int32_t(p.seqlen_q);
  a.seqlen_kv = int32_t(p.seqlen_kv);
  a.heads_q = p.heads_q;
  a.group = p.heads_q / p.heads_kv;
  a.scale = p.softmax_scale;
  a.scale_log2 = p.softmax_scale * kLog2e;
  a.mask = make_mask_args(p.mask);
  a.segs = p.segments;
  a.nseg = p.num_segments;
  a.blocks = make_block_args(p.blocks);
  return a;
}

// The kernel arguments of a forward (both families of kernels).
inline AttnArgs forward_args(const ForwardParams& p) {
  AttnArgs a = call_args(p);
  a.o = p.o;
  a.o_fp32 = p.o_fp32;
  a.o_prior = p.o_prior;
  a.lse_prior = p.lse_prior;
  return a;
}

// The kernel arguments of a backward (both families; accumulate_dq is the mma.sync launcher's).
inline AttnArgs backward_args(const BackwardParams& p) {
  AttnArgs a = call_args(p);
  a.d_o = p.d_o;
  a.delta = p.delta;
  a.dq = p.dq;
  a.dk = p.dk;
  a.dv = p.dv;
  a.dkdv_out = !p.write_dkdv ? GradOut::add_fp32 : p.write_dkdv_fp32 ? GradOut::write_fp32 : GradOut::write_dtype;
  a.dk_add = p.dk_add;
  a.dv_add = p.dv_add;
  a.add_begin = int32_t(p.add_begin);
  a.add_end = int32_t(p.add_end);
  return a;
}

// Calls whose rows all see one run of keys: no block list, no segments (their lengths live on the
// device), no window. The Hopper kernels' larger configurations serve only these.
template <class Params> bool plain_call(const Params& p) {
  return !p.blocks && p.num_segments == 0 && p.mask.window_left < 0 && p.mask.window_right < 0;
}

// CTAs along x: tiles of `block` over `len`, plus one per segment (each segment's last tile may be
// partial), when segments are given: their lengths live on the device and are not read here.
inline int64_t tile_grid(int64_t len, int32_t block, int32_t nseg) {
  return (len + block - 1) / block + nseg;
}

} // namespace attncore::cuda
