// An explicit block mask (pattern = "explicit", parameter mask_file): a text file.
//
//   # a comment runs from '#' to the end of its line; blank lines are ignored
//   attnhost-block-mask 1     the format and its version: the first line that is not a comment
//   block_size 64             tokens per block, 64 or 128: the case's block_size
//   blocks 16 16              query blocks, key blocks
//   heads 1                   1: one mask for every query head; H: one per query head (H = heads)
//   1000000000000000          then heads x query-blocks rows, one per line, head 0's first: a
//   1100000000000000          character per key block, '1' keeps the block and '0' skips it
//   ...                       (spaces inside a row are ignored)
//
// A mask made for a longer sequence serves a shorter one: a problem of S tokens uses the top-left
// ceil(S / block_size) x ceil(S / block_size) corner, as a prefix of the sequence would.
// The problem's causal and window masks apply on top: a kept block they hide entirely is skipped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace blocksparse {

struct MaskFile {
  std::string path;
  int32_t block_size = 0, q_blocks = 0, kv_blocks = 0, heads = 0;
  std::vector<uint8_t> keep;  // [heads][q_blocks][kv_blocks], 1 = kept

  bool kept(int32_t head, int32_t qb, int32_t kb) const {
    return keep[(static_cast<size_t>(head) * q_blocks + qb) * kv_blocks + kb] != 0;
  }
};

// Throws attnhost::Error (ATTNHOST_ERR_INVALID_ARGUMENT) with one line, "PATH:LINE: what" (or
// "PATH:LINE:COLUMN: what" for a bad character, "PATH: what" for the file as a whole).
MaskFile read_mask_file(const std::string& path);

// "" when the mask serves a problem of `seqlen` tokens, `heads_q` query heads and blocks of
// `block_size`; else why not, in one line that names the file.
std::string mask_file_mismatch(const MaskFile& m, int32_t block_size, int64_t seqlen, int32_t heads_q);

}  // namespace blocksparse
