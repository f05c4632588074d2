// The two ways a dense sequence is cut over the members of a ring, and the calls each member makes
// at each step (docs/VARIANTS.md, ring and zigzag). A member's block is its tokens in local order;
// the ring plugins hand one block to each rank, usp one to each Ulysses group (then cut among its
// ranks), ulysses the whole sequence to a ring of one.
#pragma once

#include "attncore/plugin/dense_mask.h"
#include "attncore/plugin/ring.h"

#include <attnhost/plugin.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace attncore::plugin {

// Contiguous blocks: member m holds tokens [m*n, (m+1)*n) with n = ceil(S / members); the last
// block's tail is padding. Any mask: a step whose block the mask hides is skipped, an edge block masked.
class ContiguousPlan {
 public:
  ContiguousPlan(const DenseMask& mask, int members)
      : mask_(mask), block_((mask.seqlen + members - 1) / members) {}

  int64_t block_tokens() const { return block_; }  // the local extent, padding included
  void add_block(attnhost::Layout& layout, int member) const { layout.add(begin(member), real(member)); }

  std::vector<BlockCall> calls(int member, int source) const {
    const int64_t q0 = begin(member), k0 = begin(source);
    const DenseMask::Block block = mask_.block(q0, q0 + real(member), k0, k0 + real(source));
    if (block == DenseMask::Block::empty) return {};  // e.g. causal, a later member's block
    return {{0, real(member), 0, real(source), q0, k0, block == DenseMask::Block::partial}};
  }

 private:
  int64_t begin(int member) const { return std::min(mask_.seqlen, member * block_); }
  int64_t real(int member) const { return std::min(mask_.seqlen, (member + 1) * block_) - begin(member); }

  DenseMask mask_;
  int64_t block_;
};

// Zigzag blocks, for a causal mask without a window: the sequence is cut into 2M chunks of
// c = S / (2M) and member m holds chunks m and 2M-1-m, so every member does the same work at every step:
//   its own block: each local chunk attends itself causally, the late one also the early one; the
//     early chunk comes first locally as in the sequence, so that is causal attention over the local
//     order (positions 0..2c-1 stand for the global ones: a causal mask compares positions by order);
//   the block of an earlier member: both local chunks attend its first chunk, in full;
//   the block of a later member: the late local chunk attends both of its chunks, in full.
class ZigzagPlan {
 public:
  ZigzagPlan(int64_t seqlen, int members) : chunk_(seqlen / (2 * members)), members_(members) {}

  int64_t block_tokens() const { return 2 * chunk_; }
  void add_block(attnhost::Layout& layout, int member) const {
    layout.add(early(member), chunk_);
    layout.add(late(member), chunk_);
  }

  std::vector<BlockCall> calls(int member, int source) const {
    const int64_t c = chunk_;
    if (source == member) return {{0, 2 * c, 0, 2 * c, 0, 0, true}};
    if (source < member) return {{0, 2 * c, 0, c, early(member), early(source), false}};
    return {{c, 2 * c, 0, 2 * c, late(member), early(source), false}};
  }

 private:
  int64_t early(int member) const { return member * chunk_; }
  int64_t late(int member) const { return (2 * int64_t{members_} - 1 - member) * chunk_; }

  int64_t chunk_;
  int members_;
};

}  // namespace attncore::plugin
