// Which tiles a CTA visits, and which pairs inside a tile are visible. Shared by every kernel.
//
// A CTA owns a tile of rows (forward, dQ) or of columns (dK/dV) inside one region: the whole call,
// or one segment. Positions are global (attention.h), so the causal/window mask of a pair depends
// only on diff = key position - query position: visible iff lo <= diff <= hi. Tiles wholly outside
// the mask are never visited; tiles wholly inside skip the per-element test.
#pragma once

#include <climits>
#include <cstdint>

#include "attncore/attention.h"
#include "cta_order.h"
#include "device.cuh"

namespace attncore::cuda {

// Windows are clamped to 2^29 positions and diffs to 2^30, so per-element tests stay in int32.
constexpr int64_t kMaxWindow = int64_t(1) << 29;
constexpr int64_t kDiffClamp = int64_t(1) << 30;

struct MaskArgs {
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  int64_t q_pos0 = 0, kv_pos0 = 0;
  int32_t diff_lo = INT_MIN, diff_hi = INT_MAX; // visible iff diff_lo <= diff <= diff_hi
};

inline MaskArgs make_mask_args(const Mask& m) {
  MaskArgs a;
  a.causal = m.causal;
  a.window_left = m.window_left < 0 ? -1 : (m.window_left < kMaxWindow ? m.window_left : kMaxWindow);
  a.window_right = m.window_right < 0 ? -1 : (m.window_right < kMaxWindow ? m.window_right : kMaxWindow);
  a.q_pos0 = m.q_pos0;
  a.kv_pos0 = m.kv_pos0;
  if (a.window_left >= 0) a.diff_lo = -int32_t(a.window_left);
  if (a.causal) a.diff_hi = 0;
  if (a.window_right >= 0 && a.window_right < a.diff_hi) a.diff_hi = int32_t(a.window_right);
  return a;
}

// Block list as the kernels read it (device arrays; heads == 0: none).
struct BlockArgs {
  int32_t block_q = 0, block_kv = 0, num_q_blocks = 0, num_kv_blocks = 0, heads = 0;
  const int32_t* row_ptr = nullptr;
  const int32_t* kv_block = nullptr;
  const uint8_t* masked = nullptr;
  const int32_t* col_ptr = nullptr;
  const int32_t* q_block = nullptr;
  const uint8_t* q_masked = nullptr;
  // The Hopper backward with long key columns shared out (BlockList::pieces): a CTA a piece
  // (blockIdx.x), the CSC above then the pieces' own (num_kv_blocks their columns a head). Null: a
  // CTA a key tile.
  const int32_t* pieces = nullptr;
};

struct Region {
  int32_t row_begin, row_end, col_begin, col_end;
  int64_t row_pos0, col_pos0; // global positions of row_begin and col_begin

  __device__ int64_t row_pos(int32_t r) const { return row_pos0 + (r - row_begin); }
  __device__ int64_t col_pos(int32_t c) const { return col_pos0 + (c - col_begin); }
  __device__ int32_t col_of(int64_t pos) const { return clamp_index(pos - col_pos0 + col_begin); }
  __device__ int32_t row_of(int64_t pos) const { return clamp_index(pos - row_pos0 + row_begin); }
  __device__ static int32_t clamp_index(int64_t x) {
    return int32_t(x < -1 ? -1 : (x > int64_t(INT_MAX) - 1 ? int64_t(INT_MAX) - 1 : x));
  }
  // diff of (row r, col c), clamped: per-element diffs add small tile offsets to it.
  __device__ int32_t diff(int32_t r, int32_t c) const {
    const int64_t d = col_pos(c) - row_pos(r);
    return int32_t(d < -kDiffClamp ? -kDiffClamp : (d > kDiffClamp ? kDiffClamp : d));
  }
};

__device__ __forceinline__ bool visible(const MaskArgs& m, int32_t diff) {
  return diff >= m.diff_lo && diff <= m.diff_hi;
}

// The offsets x, from a base diff, whose diff base + x is visible: lo <= x <= hi. A tile's
// per-element test then compares an offset known at compile time (the element's place in the
// fragment) with two bounds made once per row, rather than forming each element's diff.
struct Band {
  int32_t lo, hi;
};
__device__ __forceinline__ Band band_from(const MaskArgs& m, int32_t base) {
  const auto rel = [&](int32_t bound) {
    const int64_t x = int64_t(bound) - base;
    return int32_t(x < INT_MIN ? INT_MIN : (x > INT_MAX ? INT_MAX : x));
  };
  return Band{rel(m.diff_lo), rel(m.diff_hi)};
}
__device__ __forceinline__ bool in_band(const Band& b, int32_t x) { return x >= b.lo && x <= b.hi; }
__device__ __forceinline__ Band empty_band() { return Band{1, 0}; }
__device__ __forceinline__ Band full_band() { return Band{INT_MIN, INT_MAX}; }

// In a score tile (rows are queries, columns keys) whose element (0, 0) has diff `base`, held as
// mma accumulator fragments (element e of n8 tile j is row 8 (e / 2) + lane / 4, column 8 j +
// 2 (lane % 4) + e % 2): the column offsets 8 j + e % 2 that the lane's row r keeps, the Mask's
// where `masked`, else all, cut at the region's end (`cols`: the region's columns from the tile's
// first).
__device__ __forceinline__ Band row_band(const MaskArgs& m, bool masked, int32_t base, int r, int32_t cols,
                                         int lane) {
  Band b = masked ? band_from(m, base + (lane & 3) * 2 - r) : full_band();
  b.hi = min(b.hi, cols - (lane & 3) * 2 - 1);
  return b;
}

// Every pair of rows at positions [qf, ql] and keys at [kf, kl] is visible.
__device__ __forceinline__ bool all_visible(const MaskArgs& m, int64_t qf, int64_t ql, int64_t kf, int64_t kl) {
  return (!m.causal || kl <= qf) && (m.window_left < 0 || kf >= ql - m.window_left) &&
         (m.window_right < 0 || kl <= qf + m.window_right);
}

// Columns [lo, hi) of `reg` that some row in [r_first, r_last] sees: the rows' intervals move by
// one per row and never vanish, so their union is one interval.
__device__ __forceinline__ void visible_cols(const MaskArgs& m, const Region& reg, int32_t r_first, int32_t r_last,
                                             int32_t& lo, int32_t& hi) {
  lo = reg.col_begin;
  hi = reg.col_end;
  if (m.window_left >= 0) lo = max(lo, reg.col_of(reg.row_pos(r_first) - m.window_left));
  if (m.causal) hi = min(hi, reg.col_of(reg.row_pos(r_last)) + 1);
  if (m.window_right >= 0) hi = min(hi, reg.col_of(reg.row_pos(r_last) + m.window_right) + 1);
}

// Rows [lo, hi) of `reg` that see some column in [c_first, c_last].
__device__ __forceinline__ void visible_rows(const MaskArgs& m, const Region& reg, int32_t c_first, int32_t c_last,
                                             int32_t& lo, int32_t& hi) {
  lo = reg.row_begin;
  hi = reg.row_end;
  if (m.causal) lo = max(lo, reg.row_of(reg.col_pos(c_first)));
  if (m.window_right >= 0) lo = max(lo, reg.row_of(reg.col_pos(c_first) - m.window_right));
  if (m.window_left >= 0) hi = min(hi, reg.row_of(reg.col_pos(c_last) + m.window_left) + 1);
}

__device__ __forceinline__ Region whole_call(const MaskArgs& m, int32_t seqlen_q, int32_t seqlen_kv) {
  return Region{0, seqlen_q, 0, seqlen_kv, m.q_pos0, m.kv_pos0};
}
__device__ __forceinline__ Region segment_region(const Segment& s) {
  return Region{s.q_begin, s.q_end, s.kv_begin, s.kv_end, s.q_pos0, s.kv_pos0};
}

// The CTA's tile `x` among all segments' tiles (tiles of `block` rows, or columns when !by_rows),
// counted segment by segment. Called by whole warps: 32 segments per step, a warp prefix sum.
// Returns false when x is past the last tile (the launch is sized for the worst case).
__device__ inline bool locate_tile(const Segment* segs, int32_t nseg, int32_t x, int32_t block, bool by_rows,
                                   int32_t& seg, int32_t& tile) {
  const int lane = threadIdx.x & 31;
  int32_t base = 0;
  for (int32_t s0 = 0; s0 < nseg; s0 += 32) {
    const int32_t s = s0 + lane;
    int32_t count = 0;
    if (s < nseg) {
      const Segment g = segs[s];
      const int32_t len = by_rows ? g.q_end - g.q_begin : g.kv_end - g.kv_begin;
      count = len > 0 ? (len + block - 1) / block : 0;
    }
    int32_t inclusive = count;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t y = __shfl_up_sync(kFullMask, inclusive, o);
      if (lane >= o) inclusive += y;
    }
    const int32_t total = __shfl_sync(kFullMask, inclusive, 31);
    if (x < base + total) {
      const unsigned past = __ballot_sync(kFullMask, x < base + inclusive);
      const int first = __ffs(int(past)) - 1;
      seg = s0 + first;
      tile = x - base - __shfl_sync(kFullMask, inclusive - count, first);
      return true;
    }
    base += total;
  }
  return false;
}

// One step of a row tile's walk over key tiles: the tile's first column, and for each of the (at
// most two) query blocks in the row tile whether it visits the tile and must mask it per element.
struct KvStep {
  int32_t c0;
  bool active[2];
  bool masked[2]; // apply the causal/window mask per element
  bool cross;     // the tile runs past the region's last column: mask columns per element
};

// Walks the key tiles of width kN that rows [r0, r1) visit, in increasing order, either the
// interval the mask allows or the union of (at most two) block-list rows, all sorted ascending.
// The state is a few integers: the mask, region and block list are passed to each call rather than
// copied in, so that a kernel's registers hold them once (or read them from parameter space).
template <int kN> struct KvWalk {
  int32_t e[2], end[2]; // interval: e[0] the next tile, end[0] the end; block list: list cursors
  int32_t block, sub;
  bool blocks, act[2], m[2];

  __device__ void init_interval(const MaskArgs& mask, const Region& reg, int32_t r0, int32_t r1) {
    blocks = false;
    int32_t lo, hi;
    visible_cols(mask, reg, r0, r1 - 1, lo, hi);
    e[0] = end[0] = 0;
    if (hi > lo) {
      e[0] = (lo - reg.col_begin) / kN;
      end[0] = (hi - reg.col_begin + kN - 1) / kN;
    }
  }
  // row_a, row_b: block-list rows (CSR) of the two query blocks (the same row when only one).
  __device__ void init_blocks(const BlockArgs& bl, int32_t row_a, int32_t row_b) {
    blocks = true;
    e[0] = bl.row_ptr[row_a];
    end[0] = bl.row_ptr[row_a + 1];
    if (row_b != row_a) {
      e[1] = bl.row_ptr[row_b];
      end[1] = bl.row_ptr[row_b + 1];
    } else {
      e[1] = end[1] = 0;
    }
    sub = 0;
  }

  __device__ bool next(KvStep& s, const MaskArgs& mask, const Region& reg, int32_t r0, int32_t r1,
                       const BlockArgs& bl) {
    if (!blocks) {
      if (e[0] >= end[0]) return false;
      s.c0 = reg.col_begin + e[0] * kN;
      const bool full =
          all_visible(mask, reg.row_pos(r0), reg.row_pos(r1 - 1), reg.col_pos(s.c0), reg.col_pos(s.c0 + kN - 1));
      s.active[0] = s.active[1] = true;
      s.masked[0] = s.masked[1] = !full;
      s.cross = s.c0 + kN > reg.col_end;
      ++e[0];
      return true;
    }
    const int32_t tiles_per_block = bl.block_kv / kN;
    while (true) {
      if (sub == 0) { // the smallest block either list still holds
        const int32_t h0 = e[0] < end[0] ? bl.kv_block[e[0]] : INT_MAX;
        const int32_t h1 = e[1] < end[1] ? bl.kv_block[e[1]] : INT_MAX;
        block = min(h0, h1);
        if (block == INT_MAX) return false;
        act[0] = h0 == block;
        act[1] = h1 == block;
        m[0] = act[0] && bl.masked[e[0]];
        m[1] = act[1] && bl.masked[e[1]];
        e[0] += act[0];
        e[1] += act[1];
      }
      const int32_t c0 = (block * tiles_per_block + sub) * kN;
      sub = sub + 1 == tiles_per_block ? 0 : sub + 1;
      if (c0 >= reg.col_end) continue; // the last block is shorter than the others
      s.c0 = c0;
      s.active[0] = act[0];
      s.active[1] = act[1];
      s.masked[0] = m[0];
      s.masked[1] = m[1];
      s.cross = c0 + kN > reg.col_end;
      return true;
    }
  }
};

// One step of a key tile's walk over query tiles (dK/dV): the query head, the tile's first row,
// and for each of the (at most two) key blocks of a block list in the key tile whether it is seen
// by this query tile and must be masked per element.
struct QStep {
  int32_t head; // query head
  int32_t r0;
  bool active[2];
  bool masked[2];
};

// A CTA's key tile x when a block list's long columns are cut in pieces (BlockList::pieces): its
// first key, and its group's slot (-1: the tile's keys are its own). The piece's query blocks are
// in the pieces' own CSC, which the walk reads.
struct TilePiece {
  int32_t n0, slot;
  int32_t run = 0, kv_head = 0;  // the Hopper backward CTA's run of query heads and its kv head (cta_place)
  // With the last wave in parts (AttnArgs::tail): the CTA's batch, and its part of tail tile `tail`
  // (-1: a whole tile).
  int32_t batch = 0, part = 0, tail = -1;
};
template <int kN> __device__ __forceinline__ TilePiece tile_piece(const int32_t* pieces, int32_t x) {
  constexpr int32_t kTiles = kPieceKeys / kN; // key tiles a group
  const int4 p = reinterpret_cast<const int4*>(pieces)[x / kTiles];
  return TilePiece{p.x * kPieceKeys + (x % kTiles) * kN, p.w};
}

// Walks, for the key tile [c0, c0 + kN), every (query head of the group, query tile of kM rows)
// that sees it: heads in order, tiles in increasing order within a head; with a block list, the
// union of the (at most two) key blocks' CSC columns, each sorted ascending (or the CTA's piece of
// them, BlockArgs::pieces).
template <int kM, int kN> struct QWalk {
  int32_t head, head_end;
  int32_t e[2], end[2], t_begin; // interval: e[0] the next tile, end[0] the end; block list: cursors
  int32_t full_lo, full_hi;      // interval: the tiles in [full_lo, full_hi) see every key of the tile
  int32_t kb0, kb1, block, sub;
  bool blocks, act[2], m[2];

  __device__ void init(const MaskArgs& mask, const Region& reg, const BlockArgs& bl, int32_t head0, int32_t group,
                       int32_t c0) {
    head = head0;
    head_end = head0 + group;
    blocks = bl.heads > 0;
    if (!blocks) {
      int32_t lo, hi;
      visible_rows(mask, reg, c0, c0 + kN - 1, lo, hi);
      if (hi <= lo) {
        head = head_end; // nothing sees this tile
        return;
      }
      t_begin = e[0] = (lo - reg.row_begin) / kM;
      end[0] = (hi - reg.row_begin + kM - 1) / kM;
      full_tiles(mask, reg, c0);
    } else {
      kb0 = c0 / bl.block_kv;
      kb1 = (min(c0 + kN, reg.col_end) - 1) / bl.block_kv;
      if (bl.pieces) { // the piece's own columns: kb's column c of the group is the piece's column c
        const int32_t piece = int32_t(blockIdx.x) / (kPieceKeys / kN);
        const int32_t shift = (piece - c0 / kPieceKeys) * (kPieceKeys / bl.block_kv);
        kb0 += shift;
        kb1 += shift;
      }
      start_head(bl);
    }
  }
  // Only share `part` of `parts` of each head's query tiles (the last wave in parts, cta_order.h).
  __device__ void keep_part(int32_t part, int32_t parts) {
    if (head < head_end) {
      part_of_rows(t_begin, end[0], part, parts);
      e[0] = t_begin;
    }
  }
  // The query tiles (kM rows from reg.row_begin) whose every row sees every key of [c0, c0 + kN):
  // one interval, as each bound of the mask moves one way with the row. Worked out once, so that a
  // step's flag is two compares rather than 64-bit positions. A tile's rows are taken as kM even for
  // the region's last, shorter tile: that can only call a full tile masked, which is safe.
  __device__ void full_tiles(const MaskArgs& mask, const Region& reg, int32_t c0) {
    const int64_t kf = reg.col_pos(c0), kl = reg.col_pos(c0 + kN - 1), q0 = reg.row_pos0;
    const auto ceil_div = [](int64_t x) { return x >= 0 ? (x + kM - 1) / kM : -((-x) / kM); };
    const auto floor_div = [](int64_t x) { return x >= 0 ? x / kM : -((-x + kM - 1) / kM); };
    int64_t lo = 0, hi = end[0]; // tile t: rows at positions q0 + t kM .. q0 + t kM + kM - 1
    if (mask.causal) lo = max(lo, ceil_div(kl - q0));                      // first row >= kl
    if (mask.window_right >= 0) lo = max(lo, ceil_div(kl - mask.window_right - q0));
    if (mask.window_left >= 0) hi = min(hi, floor_div(kf + mask.window_left + 1 - q0)); // last row <= kf + wl
    lo = min(lo, int64_t(end[0])); // positions are 64-bit: clamp before narrowing
    full_lo = int32_t(lo);
    full_hi = int32_t(max(lo, hi));
  }
  __device__ void start_head(const BlockArgs& bl) {
    const int32_t col = (bl.heads == 1 ? 0 : head) * bl.num_kv_blocks;
    e[0] = bl.col_ptr[col + kb0];
    end[0] = bl.col_ptr[col + kb0 + 1];
    if (kb1 != kb0) {
      e[1] = bl.col_ptr[col + kb1];
      end[1] = bl.col_ptr[col + kb1 + 1];
    } else {
      e[1] = end[1] = 0;
    }
    sub = 0;
  }

  __device__ bool next(QStep& s, const MaskArgs& mask, const Region& reg, const BlockArgs& bl, int32_t c0) {
    while (head < head_end) {
      if (!blocks) {
        if (e[0] < end[0]) {
          s.head = head;
          s.r0 = reg.row_begin + e[0] * kM;
          s.active[0] = s.active[1] = true;
          s.masked[0] = s.masked[1] = e[0] < full_lo || e[0] >= full_hi;
          ++e[0];
          return true;
        }
      } else {
        const int32_t tiles_per_block = bl.block_q / kM;
        while (true) {
          if (sub == 0) { // the smallest query block either column still holds
            const int32_t h0 = e[0] < end[0] ? bl.q_block[e[0]] : INT_MAX;
            const int32_t h1 = e[1] < end[1] ? bl.q_block[e[1]] : INT_MAX;
            block = min(h0, h1);
            if (block == INT_MAX) break;
            act[0] = h0 == block;
            act[1] = h1 == block;
            m[0] = act[0] && bl.q_masked[e[0]];
            m[1] = act[1] && bl.q_masked[e[1]];
            e[0] += act[0];
            e[1] += act[1];
          }
          const int32_t r0 = (block * tiles_per_block + sub) * kM;
          sub = sub + 1 == tiles_per_block ? 0 : sub + 1;
          if (r0 >= reg.row_end) continue; // the last block is shorter than the others
          s.head = head;
          s.r0 = r0;
          s.active[0] = act[0];
          s.active[1] = act[1];
          s.masked[0] = m[0];
          s.masked[1] = m[1];
          return true;
        }
      }
      if (++head < head_end) {
        if (blocks) start_head(bl);
        else e[0] = t_begin;
      }
    }
    return false;
  }
};

} // namespace attncore::cuda
