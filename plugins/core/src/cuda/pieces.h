// Long key columns of a block list shared out over several CTAs of the Hopper backward
// (BlockList::pieces). A sink or global key block that every query block reads is, walked whole,
// one CTA's work while the rest of the GPU waits for it; cut into pieces of about the other
// columns' length, its CTAs end with the rest (docs/KERNELS.md, "Long key columns in pieces").
#pragma once

#include <cuda_runtime_api.h>

#include "args.h"

namespace attncore::cuda {

// Whether the backward call p walks its block list by pieces. If so, sets a's pieces and, for a
// call that writes dK and dV, the split groups' sums in p.workspace (cleared on `stream`). The
// grid's x is then piece_tiles(p, block_n) CTAs.
bool share_out_pieces(const BackwardParams& p, AttnArgs& a, cudaStream_t stream);

// CTAs along x for key tiles of width block_n when walking by pieces.
inline int64_t piece_tiles(const BackwardParams& p, int32_t block_n) {
  return int64_t(p.blocks->num_pieces) * (kPieceKeys / block_n);
}

// After the kernel: the split groups' sums written into dK and dV (in the call's output type).
void write_split_sums(const BackwardParams& p, const AttnArgs& a, cudaStream_t stream);

} // namespace attncore::cuda
