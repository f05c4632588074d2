// How blocksparse spreads a mask over ranks: contiguous, block-aligned shards (ring sharding),
// the block list of each attention call, and the K/V pieces each rank must receive from each
// other one (attncore/plugin/routed.h moves exactly those, and nothing in a round that has none).
#pragma once

#include "block_mask.h"

#include "attncore/block_list.h"
#include "attncore/plugin/routed.h"

#include <cstdint>
#include <vector>

namespace blocksparse {

// Rank r holds blocks [first_block(r), first_block(r + 1)) of queries and of keys/values, with
// first_block(r) = floor(r * blocks / P): shards differ by at most one block, and a rank holds none
// when there are fewer blocks than ranks. Every rank's local tensors have local_tokens() slots
// (the largest shard); slots past a rank's tokens are padding.
struct Sharding {
  int64_t seqlen = 0;
  int32_t block = 128, blocks = 0, world = 1;

  int32_t first_block(int rank) const { return static_cast<int32_t>(int64_t{rank} * blocks / world); }
  int64_t first_token(int rank) const { return std::min(seqlen, int64_t{first_block(rank)} * block); }
  int64_t tokens(int rank) const { return first_token(rank + 1) - first_token(rank); }
  int64_t local_tokens() const { return int64_t{(blocks + world - 1) / world} * block; }
};

// The block list of `rank`'s queries against `source`'s keys: rows from query block first_q_block
// (the rank's first block when source == rank, else the first with a key in source's shard) to
// the last row with one, key blocks numbered from source's first. No rows: no call.
struct CallList {
  int32_t first_q_block = 0;
  attncore::BlockListData list;
  bool empty() const { return list.num_q_blocks == 0; }
};
CallList call_list(const BlockMask& m, const Sharding& s, int rank, int source);

// The local slots of `source`'s K/V that `rank`'s queries read (any head): whole kept blocks,
// adjacent ones merged; none when source == rank.
std::vector<attncore::plugin::TokenRun> reads(const BlockMask& m, const Sharding& s, int rank, int source);

}  // namespace blocksparse
