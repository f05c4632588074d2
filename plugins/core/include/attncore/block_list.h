// Building a BlockList on the host: one description, both orders (CSR by query block for the
// forward and dQ, CSC by key block for dK/dV), sorted as the kernels require.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "attncore/attention.h"

namespace attncore {

enum class BlockState : uint8_t { skip = 0, full = 1, masked = 2 };

// Owns the arrays; view() points into them (host memory). For a CUDA call, copy the ten arrays to
// the device and point a BlockList at the copies (same sizes, same field names).
struct BlockListData {
  int32_t block_q = 128, block_kv = 128, num_q_blocks = 0, num_kv_blocks = 0, heads = 1;
  std::vector<int32_t> row_ptr, kv_block, col_ptr, q_block;
  std::vector<uint8_t> masked, q_masked;
  std::vector<int32_t> pieces; // [num_pieces][4]: how the CUDA backward shares out key columns
  std::vector<int32_t> piece_col_ptr, piece_q_block; // the pieces' own CSC (BlockList::piece_col_ptr)
  std::vector<uint8_t> piece_q_masked;
  int32_t num_split_groups = 0;

  BlockList view() const {
    BlockList b;
    b.block_q = block_q;
    b.block_kv = block_kv;
    b.num_q_blocks = num_q_blocks;
    b.heads = heads;
    b.row_ptr = row_ptr.data();
    b.kv_block = kv_block.data();
    b.masked = masked.data();
    b.num_kv_blocks = num_kv_blocks;
    b.col_ptr = col_ptr.data();
    b.q_block = q_block.data();
    b.q_masked = q_masked.data();
    b.num_pieces = int32_t(pieces.size() / 4);
    b.pieces = pieces.data();
    b.piece_col_ptr = piece_col_ptr.data();
    b.piece_q_block = piece_q_block.data();
    b.piece_q_masked = piece_q_masked.data();
    b.num_split_groups = num_split_groups;
    return b;
  }
};

// state(h, qb, kb) for h < heads (1: shared by every query head), qb < num_q_blocks, kb < num_kv_blocks.
BlockListData make_block_list(int32_t block_q, int32_t block_kv, int32_t num_q_blocks,
                              int32_t num_kv_blocks, int32_t heads,
                              const std::function<BlockState(int32_t, int32_t, int32_t)>& state);

// Fills `pieces`, the pieces' CSC and `num_split_groups` from the CSC (BlockList::pieces): key
// groups whose columns hold far more entries than the others are cut into pieces of about the
// others' length. make_block_list calls it; a list whose arrays are built otherwise calls it once
// they are.
void cut_pieces(BlockListData& d);

// The blocks that `mask` (causal / window on positions q_pos0 + i, kv_pos0 + j) makes visible,
// each full or masked: the block list that computes exactly what the mask alone computes.
BlockListData block_list_from_mask(const Mask& mask, int64_t seqlen_q, int64_t seqlen_kv,
                                   int32_t block_q, int32_t block_kv);

} // namespace attncore
