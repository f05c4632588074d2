#include "routes.h"

namespace blocksparse {

namespace {

// Entries of row (h, qb) whose key block lies in [kb0, kb1): positions into m.col.
std::pair<int64_t, int64_t> entries_in(const BlockMask& m, int32_t h, int32_t qb, int32_t kb0, int32_t kb1) {
  const size_t r = m.row(h, qb);
  const int32_t* begin = m.col.data() + m.row_ptr[r];
  const int32_t* end = m.col.data() + m.row_ptr[r + 1];
  return {std::lower_bound(begin, end, kb0) - m.col.data(), std::lower_bound(begin, end, kb1) - m.col.data()};
}

}  // namespace

CallList call_list(const BlockMask& m, const Sharding& s, int rank, int source) {
  const int32_t q0 = s.first_block(rank), q1 = s.first_block(rank + 1);
  const int32_t k0 = s.first_block(source), k1 = s.first_block(source + 1);
  CallList out;
  // Rows that reach into the source's shard: all of the rank's own, else the span with entries.
  int32_t first = q1, last = q0 - 1;
  if (source == rank) {
    first = q0;
    last = q1 - 1;
  } else {
    for (int32_t h = 0; h < m.heads; ++h)
      for (int32_t qb = q0; qb < q1; ++qb)
        if (auto [a, b] = entries_in(m, h, qb, k0, k1); b > a) {
          first = std::min(first, qb);
          last = std::max(last, qb);
        }
  }
  attncore::BlockListData& d = out.list;
  d.block_q = d.block_kv = m.block;
  d.heads = m.heads;
  d.num_q_blocks = std::max(0, last - first + 1);
  d.num_kv_blocks = k1 - k0;
  out.first_q_block = first;
  if (d.num_q_blocks == 0) return out;
  // CSR by query block, then the CSC by key block that the backward walks (counting sort).
  d.row_ptr.assign(static_cast<size_t>(d.heads) * d.num_q_blocks + 1, 0);
  d.col_ptr.assign(static_cast<size_t>(d.heads) * d.num_kv_blocks + 1, 0);
  for (int32_t h = 0; h < d.heads; ++h)
    for (int32_t qb = first; qb <= last; ++qb) {
      auto [a, b] = entries_in(m, h, qb, k0, k1);
      for (int64_t e = a; e < b; ++e) {
        d.kv_block.push_back(m.col[e] - k0);
        d.masked.push_back(m.masked[e]);
        ++d.col_ptr[static_cast<size_t>(h) * d.num_kv_blocks + (m.col[e] - k0) + 1];
      }
      d.row_ptr[static_cast<size_t>(h) * d.num_q_blocks + (qb - first) + 1] = static_cast<int32_t>(d.kv_block.size());
    }
  for (size_t c = 1; c < d.col_ptr.size(); ++c) d.col_ptr[c] += d.col_ptr[c - 1];
  d.q_block.resize(d.kv_block.size());
  d.q_masked.resize(d.kv_block.size());
  std::vector<int32_t> fill(d.col_ptr.begin(), d.col_ptr.end() - 1);
  for (int32_t h = 0; h < d.heads; ++h)
    for (int32_t qb = 0; qb < d.num_q_blocks; ++qb) {
      const size_t r = static_cast<size_t>(h) * d.num_q_blocks + qb;
      for (int32_t e = d.row_ptr[r]; e < d.row_ptr[r + 1]; ++e) {
        const int32_t at = fill[static_cast<size_t>(h) * d.num_kv_blocks + d.kv_block[e]]++;
        d.q_block[at] = qb;  // rows are visited in order: each column ascends
        d.q_masked[at] = d.masked[e];
      }
    }
  attncore::cut_pieces(d);
  return out;
}

std::vector<attncore::plugin::TokenRun> reads(const BlockMask& m, const Sharding& s, int rank, int source) {
  std::vector<attncore::plugin::TokenRun> out;
  if (rank == source) return out;
  const int32_t q0 = s.first_block(rank), q1 = s.first_block(rank + 1);
  const int32_t k0 = s.first_block(source), k1 = s.first_block(source + 1);
  std::vector<uint8_t> needed(static_cast<size_t>(k1 - k0), 0);
  for (int32_t h = 0; h < m.heads; ++h)
    for (int32_t qb = q0; qb < q1; ++qb) {
      auto [a, b] = entries_in(m, h, qb, k0, k1);
      for (int64_t e = a; e < b; ++e) needed[m.col[e] - k0] = 1;
    }
  const int64_t base = s.first_token(source);
  for (int32_t kb = k0; kb < k1; ++kb) {
    if (!needed[kb - k0]) continue;
    const int64_t begin = m.first_token(kb) - base, length = m.end_token(kb) - m.first_token(kb);
    if (!out.empty() && out.back().begin + out.back().length == begin) out.back().length += length;
    else out.push_back({begin, length});
  }
  return out;
}

}  // namespace blocksparse
