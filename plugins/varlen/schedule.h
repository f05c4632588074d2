// What varlen computes at each ring step: the attention calls of rank r with the K/V block of
// rank `source`, as segments over the two ranks' local tensors (sharding.h). A segment pairs the
// tokens of one sequence on r with the tokens of the same sequence in the block, so no pair
// across sequences and no padding slot is ever computed; a segment whose pairs the mask hides
// entirely is not made. Host side only: the plugin uploads the segments once.
//
// Causal without a left window (the documents case), one call per step:
//   own block:      each sequence's tokens [early chunk, late chunk] against themselves, causal.
//                   Their positions are not contiguous, but numbering the slots 0, 1, 2, ... keeps
//                   every causal relation (early before late, each chunk in order): one segment.
//   earlier source: all of a sequence's tokens against the source's early chunk, every pair visible;
//   later source:   the late chunk against the source's two chunks (adjacent slots), every pair visible.
// Anything else (full attention, a left window): every (chunk, chunk) pair of a sequence with
// visible pairs is a segment at its true positions; a chunk that meets several chunks of the block
// does so in as many calls (a row lies in one segment of a call), and with `deterministic` no two
// segments of a call share keys.
//
// Every call's forward covers all local rows: the rows its segments leave out get segments
// without keys (O = 0, LSE = -inf: the merge then leaves them as they were). Its backward has the
// attending segments alone (BlockCall::backward_segments). Both lists put the segments with the
// most pairs where their kernels start (the forward kernels walk the tiles from the last, the
// dK/dV kernel from the first), so that the longest tiles do not run last.
#pragma once

#include "sharding.h"

#include "attncore/attention.h"
#include "attncore/plugin/dense_mask.h"

#include <cstdint>
#include <vector>

namespace varlen {

struct StepCall {
  std::vector<attncore::Segment> forward;   // over the whole local tensors: attending (most pairs
                                            // last), then rows that attend nothing
  std::vector<attncore::Segment> backward;  // the attending ones, most pairs first
  bool masked = true;                       // apply the problem's causal/window mask
  int64_t pairs = 0;                        // visible (query, key) pairs, per head
};

// The mask within one sequence: the problem's causal and window, on positions in the sequence.
struct SequenceMask {
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  attncore::plugin::DenseMask of(int64_t length) const { return {length, causal, window_left, window_right}; }
};

// Which sequences to place whole, and on which rank (Sharding's owner; -1: split). The sequences
// with the most pairs are split over every rank, as few as need be for the others, placed whole by
// their pairs (the longest first, each on the rank with the least work so far), to give no rank more
// than kPlacementSlack over an equal share of the pairs. A placed sequence costs no communication
// and runs in one piece, where a split one is cut into 2P chunks that meet in every step.
inline constexpr double kPlacementSlack = 0.02;
std::vector<int> place_sequences(const std::vector<int64_t>& cu_seqlens, const SequenceMask& mask, int world_size);

// The calls `rank` makes with the block of `source`, in the order to make them.
std::vector<StepCall> plan_step(const Sharding& sharding, const SequenceMask& mask, int rank, int source,
                                bool deterministic);

// Visible pairs of the whole problem (every sequence, all ranks), per head.
int64_t total_pairs(const Sharding& sharding, const SequenceMask& mask);

}  // namespace varlen
