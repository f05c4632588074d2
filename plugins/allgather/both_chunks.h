// allgather's backward over both of a rank's query chunks in one call (docs/KERNELS.md, "Allgather:
// both chunks in one backward call"). A backward CTA walks one key's rows; one call a zigzag chunk
// let it walk one chunk's rows, 2048 at medium on two ranks, where its start and end cost a sixth
// of the walk.
#pragma once

#include "attncore/block_list.h"
#include "attncore/plugin/dense_mask.h"

#include <attnhost/plugin.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace allgather {

// The gathered slot in this call's order, and the call's block list: local rows against slot keys
// in blocks of kBlock, the same list for every head, evaluated with row i at position i and slot
// key j at position j under a causal mask.
struct BothChunks {
  static constexpr int32_t kBlock = 128;
  std::vector<std::vector<int64_t>> slot_keys;  // [rank][range]: where each rank's range lies in the slot
  attncore::BlockListData list;
};

// The rank's own ranges first, at their local places, then the other ranks' by global position.
// Then each own range's diagonal blocks are shifted alike on both sides, so the causal mask at the
// call's positions is the real one there, and every other block a row reaches is whole: listed full,
// it is not masked. Empty where that does not hold: a mask other than plain causal, ranges not made
// of whole blocks, a masked block whose two sides are not shifted alike.
std::optional<BothChunks> plan_both_chunks(const attncore::plugin::DenseMask& mask,
                                           const std::vector<std::vector<attnhost_token_range>>& ranges, int rank,
                                           int64_t local, int64_t seqlen);

}  // namespace allgather
