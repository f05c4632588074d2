#include "attncore/block_list.h"

#include <algorithm>

#include "workspace_bytes.h"

namespace attncore {

// A group's work is its entries over every head; the mean is over the groups that have entries. A
// group above twice the mean is cut into ranges of about the mean (and of at least kMinPiece query
// blocks a column), so that its CTAs are no longer than the others; the rest stay whole. A causal
// triangle, whose longest column is twice the mean, stays whole.
void cut_pieces(BlockListData& d) {
  d.pieces.clear();
  d.piece_col_ptr.clear();
  d.piece_q_block.clear();
  d.piece_q_masked.clear();
  d.num_split_groups = 0;
  constexpr int64_t kMinPiece = 2; // query blocks a column: a piece's fixed cost is small against it
  const int32_t cols_per_group = std::max<int32_t>(1, kPieceKeys / d.block_kv);
  const int32_t groups = (d.num_kv_blocks + cols_per_group - 1) / cols_per_group;
  std::vector<std::vector<int32_t>> rows(size_t(groups), std::vector<int32_t>{}); // q_block of each entry
  for (int32_t h = 0; h < d.heads; ++h)
    for (int32_t kb = 0; kb < d.num_kv_blocks; ++kb) {
      const int32_t col = h * d.num_kv_blocks + kb;
      auto& r = rows[size_t(kb / cols_per_group)];
      r.insert(r.end(), d.q_block.begin() + d.col_ptr[col], d.q_block.begin() + d.col_ptr[col + 1]);
    }
  int64_t entries = 0, busy = 0;
  for (const auto& r : rows) {
    entries += int64_t(r.size());
    busy += !r.empty();
  }
  if (busy == 0) return;
  const int64_t mean = (entries + busy - 1) / busy;
  const int64_t piece = std::max(mean, kMinPiece * d.heads * cols_per_group);
  for (int32_t g = 0; g < groups; ++g) {
    auto& r = rows[size_t(g)];
    const int64_t n = int64_t(r.size());
    if (n <= 2 * piece) {
      d.pieces.insert(d.pieces.end(), {g, 0, d.num_q_blocks, -1});
      continue;
    }
    std::sort(r.begin(), r.end());
    const int64_t count = (n + piece - 1) / piece;
    const int32_t slot = d.num_split_groups++;
    int32_t first = 0;
    for (int64_t k = 1; k < count; ++k) {
      // The query block at the k-th cut of the entries; a cut never splits a query block.
      int32_t end = r[size_t(n * k / count)];
      end = std::max(end, first + 1);
      if (end >= d.num_q_blocks) break;
      d.pieces.insert(d.pieces.end(), {g, first, end, slot});
      first = end;
    }
    d.pieces.insert(d.pieces.end(), {g, first, d.num_q_blocks, slot});
  }
  // The pieces' own CSC: column (h, piece, c) holds head h's entries of column c of the piece's
  // group in its query blocks, so that a CTA walks its piece as it would walk whole columns.
  const int32_t n = int32_t(d.pieces.size() / 4);
  d.piece_col_ptr.assign(size_t(d.heads) * n * cols_per_group + 1, 0);
  for (int32_t h = 0; h < d.heads; ++h)
    for (int32_t i = 0; i < n; ++i)
      for (int32_t c = 0; c < cols_per_group; ++c) {
        const int32_t g = d.pieces[4 * size_t(i)], lo = d.pieces[4 * size_t(i) + 1], hi = d.pieces[4 * size_t(i) + 2];
        const int32_t kb = g * cols_per_group + c;
        if (kb < d.num_kv_blocks)
          for (int32_t e = d.col_ptr[size_t(h) * d.num_kv_blocks + kb]; e < d.col_ptr[size_t(h) * d.num_kv_blocks + kb + 1]; ++e)
            if (d.q_block[size_t(e)] >= lo && d.q_block[size_t(e)] < hi) {
              d.piece_q_block.push_back(d.q_block[size_t(e)]);
              d.piece_q_masked.push_back(d.q_masked[size_t(e)]);
            }
        d.piece_col_ptr[(size_t(h) * n + i) * cols_per_group + c + 1] = int32_t(d.piece_q_block.size());
      }
}

BlockListData make_block_list(int32_t block_q, int32_t block_kv, int32_t num_q_blocks,
                              int32_t num_kv_blocks, int32_t heads,
                              const std::function<BlockState(int32_t, int32_t, int32_t)>& state) {
  BlockListData d;
  d.block_q = block_q;
  d.block_kv = block_kv;
  d.num_q_blocks = num_q_blocks;
  d.num_kv_blocks = num_kv_blocks;
  d.heads = heads;
  d.row_ptr.assign(size_t(heads) * num_q_blocks + 1, 0);
  d.col_ptr.assign(size_t(heads) * num_kv_blocks + 1, 0);
  std::vector<uint8_t> dense(size_t(heads) * num_q_blocks * num_kv_blocks);
  for (int32_t h = 0; h < heads; ++h)
    for (int32_t qb = 0; qb < num_q_blocks; ++qb)
      for (int32_t kb = 0; kb < num_kv_blocks; ++kb)
        dense[(size_t(h) * num_q_blocks + qb) * num_kv_blocks + kb] = uint8_t(state(h, qb, kb));
  const auto at = [&](int32_t h, int32_t qb, int32_t kb) {
    return BlockState(dense[(size_t(h) * num_q_blocks + qb) * num_kv_blocks + kb]);
  };
  for (int32_t h = 0; h < heads; ++h)
    for (int32_t qb = 0; qb < num_q_blocks; ++qb) {
      for (int32_t kb = 0; kb < num_kv_blocks; ++kb)
        if (BlockState s = at(h, qb, kb); s != BlockState::skip) {
          d.kv_block.push_back(kb);
          d.masked.push_back(s == BlockState::masked);
        }
      d.row_ptr[size_t(h) * num_q_blocks + qb + 1] = int32_t(d.kv_block.size());
    }
  for (int32_t h = 0; h < heads; ++h)
    for (int32_t kb = 0; kb < num_kv_blocks; ++kb) {
      for (int32_t qb = 0; qb < num_q_blocks; ++qb)
        if (BlockState s = at(h, qb, kb); s != BlockState::skip) {
          d.q_block.push_back(qb);
          d.q_masked.push_back(s == BlockState::masked);
        }
      d.col_ptr[size_t(h) * num_kv_blocks + kb + 1] = int32_t(d.q_block.size());
    }
  cut_pieces(d);
  return d;
}

size_t backward_workspace_bytes(const BackwardParams& p) {
  const size_t sums = split_sums_bytes(p) + tail_sums_bytes(p);  // (one or the other)
  if (!is_fp8(p.dtype) && !p.dq_out.data) return sums;
  return workspace_align(sums) + widened_inputs_bytes(p) + dq_counters_bytes(p);
}

BlockListData block_list_from_mask(const Mask& m, int64_t seqlen_q, int64_t seqlen_kv,
                                   int32_t block_q, int32_t block_kv) {
  const int32_t nq = int32_t((seqlen_q + block_q - 1) / block_q);
  const int32_t nk = int32_t((seqlen_kv + block_kv - 1) / block_kv);
  return make_block_list(block_q, block_kv, nq, nk, 1, [&](int32_t, int32_t qb, int32_t kb) {
    // Positions of the block's first and last row and column (clipped to the call).
    const int64_t qf = m.q_pos0 + int64_t(qb) * block_q;
    const int64_t ql = m.q_pos0 + std::min<int64_t>(int64_t(qb + 1) * block_q, seqlen_q) - 1;
    const int64_t kf = m.kv_pos0 + int64_t(kb) * block_kv;
    const int64_t kl = m.kv_pos0 + std::min<int64_t>(int64_t(kb + 1) * block_kv, seqlen_kv) - 1;
    const bool none = (m.causal && kf > ql) || (m.window_left >= 0 && kl < qf - m.window_left) ||
                      (m.window_right >= 0 && kf > ql + m.window_right);
    if (none) return BlockState::skip;
    const bool all = (!m.causal || kl <= qf) && (m.window_left < 0 || kf >= ql - m.window_left) &&
                     (m.window_right < 0 || kl <= qf + m.window_right);
    return all ? BlockState::full : BlockState::masked;
  });
}

} // namespace attncore
