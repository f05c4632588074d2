#include "attncore/block_list.h"

#include <algorithm>

namespace attncore {

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
  return d;
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
