#include "both_chunks.h"

#include <algorithm>
#include <utility>

namespace allgather {

using attncore::BlockState;
using attncore::plugin::DenseMask;

std::optional<BothChunks> plan_both_chunks(const DenseMask& mask,
                                           const std::vector<std::vector<attnhost_token_range>>& ranges, int rank,
                                           int64_t local, int64_t seqlen) {
  constexpr int32_t kBlock = BothChunks::kBlock;
  if (!mask.causal || mask.window_left >= 0 || mask.window_right >= 0 || local % kBlock || seqlen % kBlock) return {};
  for (const auto& of_rank : ranges)
    for (const attnhost_token_range& r : of_rank)
      if (r.length % kBlock || r.local_begin % kBlock || r.global_begin % kBlock) return {};
  BothChunks out;
  std::vector<std::pair<int64_t, std::pair<int, size_t>>> others;  // (global begin, (rank, range))
  for (int owner = 0; owner < int(ranges.size()); ++owner) {
    out.slot_keys.emplace_back(ranges[owner].size(), 0);
    for (size_t i = 0; i < ranges[owner].size(); ++i)
      if (owner == rank) out.slot_keys[owner][i] = ranges[owner][i].local_begin;
      else others.push_back({ranges[owner][i].global_begin, {owner, i}});
  }
  std::sort(others.begin(), others.end());
  int64_t at = local;
  for (const auto& [begin, who] : others) {
    out.slot_keys[who.first][who.second] = at;
    at += ranges[who.first][who.second].length;
  }
  // The global position of a local row and of a slot key (-1: padding); a block lies in one range.
  const auto row_at = [&](int64_t i) {
    for (const attnhost_token_range& r : ranges[rank])
      if (i >= r.local_begin && i < r.local_begin + r.length) return r.global_begin + (i - r.local_begin);
    return int64_t{-1};
  };
  const auto key_at = [&](int64_t j) {
    for (size_t owner = 0; owner < ranges.size(); ++owner)
      for (size_t i = 0; i < ranges[owner].size(); ++i) {
        const int64_t k0 = out.slot_keys[owner][i];
        if (j >= k0 && j < k0 + ranges[owner][i].length) return ranges[owner][i].global_begin + (j - k0);
      }
    return int64_t{-1};
  };
  bool exact = true;
  out.list = attncore::make_block_list(
      kBlock, kBlock, int32_t(local / kBlock), int32_t(seqlen / kBlock), 1, [&](int32_t, int32_t qb, int32_t kb) {
        const int64_t i = int64_t(qb) * kBlock, j = int64_t(kb) * kBlock, q = row_at(i), k = key_at(j);
        if (q < 0 || k < 0) return BlockState::skip;
        switch (mask.block(q, q + kBlock, k, k + kBlock)) {
        case DenseMask::Block::empty: return BlockState::skip;
        case DenseMask::Block::full: return BlockState::full;
        default:
          exact = exact && q - i == k - j;
          return BlockState::masked;
        }
      });
  if (!exact) return {};
  return out;
}

}  // namespace allgather
