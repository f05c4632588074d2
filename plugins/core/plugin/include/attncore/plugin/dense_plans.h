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
#include <optional>
#include <utility>
#include <vector>

namespace attncore::plugin {

// The call of local rows [q_local, + nq) at global positions from q_pos against the block's columns
// [kv_local, + nk) at positions from kv_pos, cut to the rows and keys that see one another (a window
// reaches a few of them); nothing when no pair is visible. Masked unless every pair is visible.
inline std::optional<BlockCall> dense_call(const DenseMask& mask, int64_t q_local, int64_t q_pos, int64_t nq,
                                           int64_t kv_local, int64_t kv_pos, int64_t nk) {
  const DenseMask::Rect r = mask.visible(q_pos, q_pos + nq, kv_pos, kv_pos + nk);
  if (r.rows.size() == 0 || r.keys.size() == 0) return std::nullopt;
  const bool masked = mask.block(r.rows.lo, r.rows.hi, r.keys.lo, r.keys.hi) != DenseMask::Block::full;
  return BlockCall{q_local + r.rows.lo - q_pos, q_local + r.rows.hi - q_pos,
                   kv_local + r.keys.lo - kv_pos, kv_local + r.keys.hi - kv_pos,
                   r.rows.lo, r.keys.lo, masked};
}

// Contiguous blocks: member m holds tokens [m*n, (m+1)*n) with n = ceil(S / members); the last
// block's tail is padding. Any mask: a step whose block the mask hides is skipped, a block the mask
// cuts is cut to the rows and keys that see one another.
class ContiguousPlan {
 public:
  ContiguousPlan(const DenseMask& mask, int members)
      : mask_(mask), block_((mask.seqlen + members - 1) / members) {}

  int64_t block_tokens() const { return block_; }  // the local extent, padding included
  void add_block(attnhost::Layout& layout, int member) const { layout.add(begin(member), real(member)); }

  std::vector<BlockCall> calls(int member, int source) const {
    const std::optional<BlockCall> c = dense_call(mask_, 0, begin(member), real(member), 0, begin(source), real(source));
    if (!c) return {};  // e.g. causal, a later member's block
    return {*c};
  }

 private:
  int64_t begin(int member) const { return std::min(mask_.seqlen, member * block_); }
  int64_t real(int member) const { return std::min(mask_.seqlen, (member + 1) * block_) - begin(member); }

  DenseMask mask_;
  int64_t block_;
};

// Zigzag blocks, for a causal mask: the sequence is cut into 2M chunks of c = S / (2M) and member m
// holds chunks m and 2M-1-m, so every member does the same work at every step:
//   its own block: each local chunk attends itself causally, the late one also the early one; the
//     early chunk comes first locally as in the sequence, so that is causal attention over the local
//     order (positions 0..2c-1 stand for the global ones: a causal mask compares positions by order);
//   the block of an earlier member: both local chunks attend its first chunk, in full;
//   the block of a later member: the late local chunk attends both of its chunks, in full.
// With a sliding window, positions are compared by distance, so each pair of chunks that see one
// another is a call at its true positions, cut to what the window reaches (dense_call).
class ZigzagPlan {
 public:
  ZigzagPlan(const DenseMask& mask, int members)
      : mask_(mask), chunk_(mask.seqlen / (2 * members)), members_(members) {}

  int64_t block_tokens() const { return 2 * chunk_; }
  void add_block(attnhost::Layout& layout, int member) const {
    layout.add(early(member), chunk_);
    layout.add(late(member), chunk_);
  }

  std::vector<BlockCall> calls(int member, int source) const {
    const int64_t c = chunk_;
    if (mask_.window_left >= 0) {
      // A block whose chunks are neighbours in the sequence (member M-1's) is one range.
      const auto ranges = [&](int m) {
        return late(m) == early(m) + c ? std::vector<int64_t>{0} : std::vector<int64_t>{0, c};
      };
      const auto length = [&](int m) { return late(m) == early(m) + c ? 2 * c : c; };
      std::vector<BlockCall> calls;
      // Each chunk's rows meet their first call whole (a later call of a row is merged into it):
      // the own block's chunks against themselves first.
      std::vector<std::pair<int64_t, int64_t>> pairs;  // (local row, local column)
      for (int64_t row : ranges(member)) pairs.emplace_back(row, source == member ? row : 0);
      for (int64_t row : ranges(member))
        for (int64_t col : ranges(source))
          if (std::find(pairs.begin(), pairs.end(), std::pair{row, col}) == pairs.end()) pairs.emplace_back(row, col);
      for (auto [row, col] : pairs)
        if (std::optional<BlockCall> call = dense_call(mask_, row, position(member, row), length(member), col,
                                                       position(source, col), length(source)))
          calls.push_back(*call);
      return calls;
    }
    if (source == member) return {{0, 2 * c, 0, 2 * c, 0, 0, true}};
    if (source < member) return {{0, 2 * c, 0, c, early(member), early(source), false}};
    return {{c, 2 * c, 0, 2 * c, late(member), early(source), false}};
  }

 private:
  int64_t early(int member) const { return member * chunk_; }
  int64_t late(int member) const { return (2 * int64_t{members_} - 1 - member) * chunk_; }
  int64_t position(int member, int64_t local) const { return local < chunk_ ? early(member) + local : late(member) + local - chunk_; }

  DenseMask mask_;
  int64_t chunk_;
  int members_;
};

}  // namespace attncore::plugin
