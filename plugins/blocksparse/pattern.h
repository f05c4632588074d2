// Named block-sparse patterns (docs/VARIANTS.md, blocksparse). Query block i attends key block j when
// the pattern keeps (i, j) and the problem's causal/window mask leaves some pair of it; all counts
// are in blocks of `block_size` tokens.
//
//   local         |i - j| <= window                       (sliding window of blocks)
//   strided       local, and j = i - o (mod stride)      (Sparse Transformer, strided)
//   dilated       j = i - o + t * dilation, |t| <= window (every dilation-th block; Longformer's
//                                                         dilated window, LongNet's head offsets)
//   global_local  local, and j < global, and i < global   (Longformer: global blocks attend and are
//                                                         attended by everything)
//   bigbird       global_local, and `random` blocks per row drawn from the rest (BigBird), seeded
//   streaming     local, and j < sink                     (StreamingLLM: attention sinks)
//   explicit      the blocks a mask file keeps            (mask_file.h)
//
// per_head: one mask per query head. bigbird then draws each head's random blocks apart, and
// strided/dilated give head h the offset o = h mod stride (mod dilation); without it o = 0 and one
// mask serves every head. local, global_local and streaming are the same for every head either way
// (per_head still builds, uploads and walks a list per head). Under causal attention the random
// blocks are drawn among the blocks the causal mask leaves, so none is wasted.
#pragma once

#include "block_mask.h"
#include "mask_file.h"

#include "attncore/plugin/dense_mask.h"

#include <attnhost/plugin.hpp>

#include <memory>
#include <string>

namespace blocksparse {

struct Pattern {
  std::string name = "local";
  int32_t block_size = 128;
  int64_t window = 4, stride = 4, dilation = 2, global = 1, random = 2, sink = 1, seed = 0;
  bool per_head = false;
  std::string mask_file;

  // The plugin's parameters, checked: a bad value throws ATTNHOST_ERR_INVALID_ARGUMENT naming it.
  static Pattern from(const attnhost::Problem& p);
  // "bigbird (window 1, global 1, random 2, seed 0, per head)": the name and what it reads.
  std::string describe() const;
};

// The mask of `pattern` for self-attention over `seqlen` tokens with `heads_q` query heads under
// `dense` (the problem's causal/window). One mask per query head when the pattern has per_head or
// the mask file one per head, else one shared mask.
BlockMask build_mask(const Pattern& pattern, int64_t seqlen, int32_t heads_q, const attncore::plugin::DenseMask& dense,
                     const MaskFile* file);

// build_mask, cached per shape: every rank of a run, and every later instance of the same problem
// and pattern in this process, shares one mask. `build_ms` is what this call spent building (0 on
// a hit). A mask file is re-read when its size or modification time changes.
struct SharedMask {
  std::shared_ptr<const BlockMask> mask;
  double build_ms = 0;
  bool cached = false;
};
SharedMask shared_mask(const Pattern& pattern, int64_t seqlen, int32_t heads_q, const attncore::plugin::DenseMask& dense);

}  // namespace blocksparse
