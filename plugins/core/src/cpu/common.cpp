#include "common.h"

#include <algorithm>

namespace attncore {

std::string check_supported_cpu(DType dtype, int32_t head_dim) {
  if (dtype != DType::bf16 && dtype != DType::fp16 && dtype != DType::fp32 && !is_fp8(dtype))
    return "attncore cpu: dtype must be bf16, fp16, fp32, fp8_e4m3 or fp8_e5m2";
  if (head_dim < 1) return "attncore cpu: head_dim must be at least 1";
  return {};
}

} // namespace attncore

namespace attncore::cpu::detail {

std::vector<Region> regions(int64_t seqlen_q, int64_t seqlen_kv, const Mask& mask,
                            const Segment* segments, int32_t num_segments) {
  if (num_segments == 0)
    return {Region{0, seqlen_q, 0, seqlen_kv, mask.q_pos0, mask.kv_pos0}};
  if (!segments) fail("num_segments > 0 but segments is null");
  std::vector<Region> out;
  out.reserve(size_t(num_segments));
  for (int32_t s = 0; s < num_segments; ++s) {
    const Segment& g = segments[s];
    if (g.q_begin < 0 || g.q_begin > g.q_end || g.q_end > seqlen_q || g.kv_begin < 0 ||
        g.kv_begin > g.kv_end || g.kv_end > seqlen_kv)
      fail("segment " + std::to_string(s) + " lies outside the call's rows or columns");
    out.push_back(Region{g.q_begin, g.q_end, g.kv_begin, g.kv_end, g.q_pos0, g.kv_pos0});
  }
  std::vector<Region> sorted = out;
  std::sort(sorted.begin(), sorted.end(),
            [](const Region& a, const Region& b) { return a.row_begin < b.row_begin; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].row_begin < sorted[i - 1].row_end) fail("segments overlap in their rows");
  return out;
}

void check_blocks(const BlockList& bl, int64_t seqlen_q, int64_t seqlen_kv, int32_t heads_q) {
  if ((bl.block_q != 64 && bl.block_q != 128) || (bl.block_kv != 64 && bl.block_kv != 128))
    fail("block list block sizes must be 64 or 128");
  if (int64_t(bl.num_q_blocks) * bl.block_q < seqlen_q) fail("block list has too few query blocks");
  if (bl.heads != 1 && bl.heads != heads_q) fail("block list heads must be 1 or heads_q");
  if (!bl.row_ptr || (bl.row_ptr[int64_t(bl.heads) * bl.num_q_blocks] > 0 && (!bl.kv_block || !bl.masked)))
    fail("block list arrays are missing");
  const int64_t kv_blocks = (seqlen_kv + bl.block_kv - 1) / bl.block_kv;
  for (int64_t r = 0; r < int64_t(bl.heads) * bl.num_q_blocks; ++r) {
    if (bl.row_ptr[r + 1] < bl.row_ptr[r]) fail("block list row_ptr decreases");
    for (int32_t e = bl.row_ptr[r]; e < bl.row_ptr[r + 1]; ++e) {
      if (bl.kv_block[e] < 0 || bl.kv_block[e] >= kv_blocks)
        fail("block list names key block " + std::to_string(bl.kv_block[e]) + " of " +
             std::to_string(kv_blocks));
      if (e > bl.row_ptr[r] && bl.kv_block[e] <= bl.kv_block[e - 1])
        fail("block list rows must be sorted without duplicates");
    }
  }
}

void kv_tiles(const Mask& mask, const BlockList* blocks, const Region& reg, int64_t r0, int64_t r1,
              int32_t hq, int64_t seqlen_kv, std::vector<KvTile>& out) {
  out.clear();
  if (blocks) {
    const BlockList& bl = *blocks;
    const int64_t row = int64_t(bl.heads == 1 ? 0 : hq) * bl.num_q_blocks + r0 / bl.block_q;
    for (int32_t e = bl.row_ptr[row]; e < bl.row_ptr[row + 1]; ++e) {
      const int64_t begin = int64_t(bl.kv_block[e]) * bl.block_kv;
      const int64_t end = std::min<int64_t>(begin + bl.block_kv, seqlen_kv);
      for (int64_t c = begin; c < end; c += kColTile)
        out.push_back({c, std::min<int64_t>(c + kColTile, end), bl.masked[e] != 0});
    }
    return;
  }
  // The rows' visible positions form one interval [first row - left, last row (+ right)]: the
  // per-row intervals move by one per row and never shrink to nothing.
  const int64_t qf = reg.row_pos(r0), ql = reg.row_pos(r1 - 1);
  const auto col_of = [&](int64_t pos) { return pos - reg.col_pos0 + reg.col_begin; };
  int64_t lo = reg.col_begin, hi = reg.col_end;
  if (mask.window_left >= 0) lo = std::max(lo, col_of(qf - mask.window_left));
  if (mask.causal) hi = std::min(hi, col_of(ql) + 1);
  if (mask.window_right >= 0) hi = std::min(hi, col_of(ql + mask.window_right) + 1);
  for (int64_t c0 = lo; c0 < hi; c0 += kColTile) {
    const int64_t c1 = std::min(c0 + kColTile, hi);
    const bool full = (!mask.causal || reg.col_pos(c1 - 1) <= qf) &&
                      (mask.window_left < 0 || reg.col_pos(c0) >= ql - mask.window_left) &&
                      (mask.window_right < 0 || reg.col_pos(c1 - 1) <= qf + mask.window_right);
    out.push_back({c0, c1, !full});
  }
}

void check_call(DType dtype, int32_t batch, int32_t heads_q, int32_t heads_kv, int32_t head_dim,
                int64_t seqlen_q, int64_t seqlen_kv, const Segment* segments, int32_t num_segments,
                const BlockList* blocks) {
  if (std::string e = check_supported_cpu(dtype, head_dim); !e.empty()) throw Error(e);
  if (batch < 1 || heads_q < 1 || heads_kv < 1 || seqlen_q < 0 || seqlen_kv < 0)
    fail("batch and heads must be positive, lengths non-negative");
  if (heads_q % heads_kv != 0)
    fail("heads_q (" + std::to_string(heads_q) + ") must be a multiple of heads_kv (" +
         std::to_string(heads_kv) + ")");
  if (num_segments < 0 || (num_segments > 0 && !segments)) fail("bad segments");
  if (blocks && num_segments > 0) fail("a block list cannot be combined with segments");
  if (blocks) check_blocks(*blocks, seqlen_q, seqlen_kv, heads_q);
}

} // namespace attncore::cpu::detail
