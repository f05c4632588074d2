// The block mask of one problem: for each query block (per query head, or shared by all), the key
// blocks it attends, ascending, each flagged when the problem's causal/window mask cuts through it
// (the core then masks its elements; every other kept block is computed whole, unmasked).
// Built from a pattern (pattern.h) once per shape, on the host, and shared by every rank.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace blocksparse {

struct BlockMask {
  int64_t seqlen = 0;
  int32_t block = 128;
  int32_t blocks = 0;            // query blocks = key blocks = ceil(seqlen / block); the last may be partial
  int32_t heads = 1;             // 1: shared by every query head; else one per query head
  std::vector<int64_t> row_ptr;  // [heads * blocks + 1]
  std::vector<int32_t> col;      // key blocks of each row, ascending
  std::vector<uint8_t> masked;   // per entry: 1 when causal/window hide some of its pairs
  std::vector<int64_t> row_pairs;  // [heads * blocks]: visible (query, key) pairs of each row of blocks
  int64_t visible = 0;           // blocks the problem's own causal/window mask leaves, for one head

  size_t row(int32_t head, int32_t qb) const { return static_cast<size_t>(head) * blocks + qb; }
  std::span<const int32_t> keys(int32_t head, int32_t qb) const {
    const size_t r = row(head, qb);
    return {col.data() + row_ptr[r], static_cast<size_t>(row_ptr[r + 1] - row_ptr[r])};
  }
  bool has(int32_t head, int32_t qb, int32_t kb) const {
    std::span<const int32_t> k = keys(head, qb);
    return std::binary_search(k.begin(), k.end(), kb);
  }
  int64_t first_token(int32_t b) const { return std::min(seqlen, int64_t{b} * block); }
  int64_t end_token(int32_t b) const { return std::min(seqlen, (int64_t{b} + 1) * block); }

  int64_t kept() const { return static_cast<int64_t>(col.size()); }
  // Kept blocks over the whole grid (heads x blocks x blocks), and over the blocks the problem's
  // causal/window mask alone would visit: what the pattern saves beyond that mask.
  double density() const { return blocks ? double(kept()) / (double(heads) * blocks * blocks) : 0.0; }
  double density_of_visible() const { return visible ? double(kept()) / (double(heads) * visible) : 0.0; }
};

}  // namespace blocksparse
