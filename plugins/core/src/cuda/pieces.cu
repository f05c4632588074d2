#include "pieces.h"

#include <cstdint>
#include <type_traits>

#include "device.cuh"
#include "launch.h"

namespace attncore::cuda {

bool share_out_pieces(const BackwardParams& p, AttnArgs& a, cudaStream_t stream) {
  const BlockList* b = p.blocks;
  if (!b || b->num_split_groups == 0 || b->num_pieces == 0 || !b->pieces || !b->piece_col_ptr || p.num_segments > 0)
    return false;
  const size_t bytes = backward_workspace_bytes(p);
  if (bytes > 0 && (!p.workspace || p.workspace_bytes < bytes || reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0))
    return false; // no room to add the pieces up: whole columns
  // The pieces' CSC in place of the whole columns'.
  a.blocks.pieces = b->pieces;
  a.blocks.col_ptr = b->piece_col_ptr;
  a.blocks.q_block = b->piece_q_block;
  a.blocks.q_masked = b->piece_q_masked;
  a.blocks.num_kv_blocks = b->num_pieces * (kPieceKeys / b->block_kv);
  if (bytes > 0) {
    const int64_t keys = int64_t(kPieceKeys) * p.head_dim;
    const int64_t slot = int64_t(p.batch) * p.heads_kv * keys;
    a.split_dk = TensorRef{p.workspace, int64_t(p.heads_kv) * keys, p.head_dim, keys};
    a.split_dv = a.split_dk;
    a.split_dv.data = static_cast<float*>(p.workspace) + slot * b->num_split_groups;
    a.split_slot_stride = slot;
    if (cudaMemsetAsync(p.workspace, 0, bytes, stream) != cudaSuccess) check_launch("clearing the split key groups' sums");
  }
  return true;
}

namespace {

// One block a (piece, kv head, batch); the first piece of each split group writes the group's keys.
template <class TO>
__global__ void __launch_bounds__(256) write_split_sums_kernel(const __grid_constant__ AttnArgs a, int32_t head_dim) {
  const int4* pieces = reinterpret_cast<const int4*>(a.blocks.pieces);
  const int32_t x = int32_t(blockIdx.x), kv_head = int32_t(blockIdx.y), batch = int32_t(blockIdx.z);
  const int4 piece = pieces[x];
  if (piece.w < 0 || (x > 0 && pieces[x - 1].w == piece.w)) return;
  const int32_t g0 = piece.x * kPieceKeys, keys = min(kPieceKeys, a.seqlen_kv - g0);
  const int32_t pairs = keys * (head_dim / 2);
  for (int which = 0; which < 2; ++which) {
    const TensorRef sums = split_slot(which == 0 ? a.split_dk : a.split_dv, piece.w, a.split_slot_stride);
    const TensorRef& out = which == 0 ? a.dk : a.dv;
    const float* src = static_cast<const float*>(sums.data) + batch * sums.batch_stride + kv_head * sums.head_stride;
    for (int32_t i = int32_t(threadIdx.x); i < pairs; i += int32_t(blockDim.x)) {
      const int32_t key = i / (head_dim / 2), col = 2 * (i % (head_dim / 2));
      const float2 v = *reinterpret_cast<const float2*>(src + int64_t(key) * sums.token_stride + col);
      const int64_t off = batch * out.batch_stride + kv_head * out.head_stride + int64_t(g0 + key) * out.token_stride + col;
      if constexpr (std::is_same_v<TO, float>) *reinterpret_cast<float2*>(static_cast<float*>(out.data) + off) = v;
      else *reinterpret_cast<uint32_t*>(static_cast<TO*>(out.data) + off) = pack2<TO>(v.x, v.y);
    }
  }
}

} // namespace

void write_split_sums(const BackwardParams& p, const AttnArgs& a, cudaStream_t stream) {
  if (!a.split_dk.data) return;
  const dim3 grid(unsigned(p.blocks->num_pieces), unsigned(p.heads_kv), unsigned(p.batch));
  if (p.write_dkdv_fp32) write_split_sums_kernel<float><<<grid, 256, 0, stream>>>(a, p.head_dim);
  else if (p.dtype == DType::bf16) write_split_sums_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(a, p.head_dim);
  else write_split_sums_kernel<__half><<<grid, 256, 0, stream>>>(a, p.head_dim);
  check_launch("writing the split key groups' dK and dV");
}

} // namespace attncore::cuda
