// The shared-memory layout of the mma.sync kernels' tiles and the addresses of their ldmatrix
// fragments: plain integer arithmetic, so the CPU tests check it (tests/core/test_smem_tile.cpp)
// where no GPU runs.
//
// A tile is rows of kCols elements, read by ldmatrix (8 rows of 16 bytes a matrix) and written by
// 16-byte copies.
//  - padded (kSwizzled false): a row is kCols + 8 elements, so the 8 rows of an ldmatrix land in
//    distinct banks. Rows are then 16 bytes off the 128-byte lines, and a warp's copy of whole rows
//    touches 1.5 times the lines it fills (ncu; docs/KERNELS.md, "Swizzled tiles").
//  - swizzled, where a row is whole 128-byte lines (D = 64, 128, 256): unpadded, the 16-byte chunk c
//    of row r stored at chunk c ^ (r % 8) of its line (FlashAttention-2's layout): the 8 rows of an
//    ldmatrix still land in distinct banks, and a row fills its lines exactly.
// Fragment addresses are made once: a lane's address of the fragment at (0, 0) is the tile's shared
// address (128-byte aligned) plus lane_a, lane_nk or lane_kn (at_cols moves it to a warp's first
// column); at() moves it to the fragment at (row, col). Padded, that adds a constant, which ldmatrix
// takes as an immediate; swizzled, the chunk within the line is an XOR of the lane's address (the
// lane's chunk is c ^ (r % 8) with c 0 or 1 and r its row, and col / 8 is even), then the lines a
// constant. (Formed from rows and columns at every load, the addresses cost the dK/dV kernel about
// 250 IMAD a warp a step where registers are short: ncu.)
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ATTNCORE_HOST_DEVICE __host__ __device__
#else
#define ATTNCORE_HOST_DEVICE
#endif

namespace attncore::cuda {

template <class T, int kCols, bool kSwizzled> struct SmemTile {
  static constexpr int kWidth = kCols;
  static constexpr bool kXor = kSwizzled;
  static constexpr int kPitch = kSwizzled ? kCols : kCols + 8; // elements a row
  static constexpr uint32_t kRowBytes = uint32_t(kPitch * sizeof(T));
  static_assert(kCols % 8 == 0, "rows of 16-byte chunks");
  static_assert(!kSwizzled || kRowBytes % 128 == 0, "a swizzled row is whole 128-byte lines");

  ATTNCORE_HOST_DEVICE static constexpr uint32_t bytes(int rows) { return uint32_t(rows) * kRowBytes; }
  // The byte offset of elements (row, col..col+7), col % 8 == 0.
  ATTNCORE_HOST_DEVICE static constexpr uint32_t offset(int row, int col) {
    const int chunk = col / 8;
    return uint32_t(row) * kRowBytes + uint32_t(kSwizzled ? (chunk & ~7) | ((chunk ^ row) & 7) : chunk) * 16u;
  }
  // An A fragment (x4): rows 0..15, columns 0..15.
  ATTNCORE_HOST_DEVICE static constexpr uint32_t lane_a(int lane) { return offset(lane & 15, (lane >> 4) * 8); }
  // B fragments of two n8 tiles (x4) from a tile that holds B's columns as rows (K in Q K^T); also
  // the A fragment of a transposed tile (x4, .trans: dS = (dS^T)^T).
  ATTNCORE_HOST_DEVICE static constexpr uint32_t lane_nk(int lane) {
    return offset((lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8);
  }
  // B fragments of two n8 tiles (x4, .trans) from a row-major B (V in P V); an x2 load of one n8
  // tile reads lanes 0-15's addresses only.
  ATTNCORE_HOST_DEVICE static constexpr uint32_t lane_kn(int lane) {
    return offset((lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8);
  }
  // A lane's address moved to columns col0.. (a multiple of kColStep): steps of whole lines are
  // added; swizzled, a step of part of a line (D = 64's 32 columns) moves the lane's chunk within
  // its line, as at() does: added, the chunks' sum could leave the line.
  template <int kColStep> ATTNCORE_HOST_DEVICE static constexpr uint32_t at_cols(uint32_t lane_addr, int col0) {
    static_assert(!kSwizzled || kColStep % 16 == 0, "whole fragments of a swizzled row");
    if constexpr (!kSwizzled || kColStep % 64 == 0) return lane_addr + offset(0, col0);
    else return at(lane_addr, 0, col0);
  }
  // The fragment at (row, col) for a lane whose fragment (0, 0) is at `lane_addr`: row % 8 == 0 and
  // col % 16 == 0 (col % 8 == 0 for an x2 load of lane_kn); swizzled, the lane's own column within
  // its line and col must add without carries (col0 % 64 + col < 64 with at_cols' col0).
  ATTNCORE_HOST_DEVICE static constexpr uint32_t at(uint32_t lane_addr, int row, int col) {
    if constexpr (kSwizzled)
      return (lane_addr ^ uint32_t(col / 8 % 8 * 16)) + uint32_t(row) * kRowBytes + uint32_t(col / 64 * 128);
    else
      return lane_addr + offset(row, col);
  }
  // The address of (r + dr, c) from that of (r, c) (dr % 4 == 0: r % 8 moves by 0 or by 4, an XOR).
  ATTNCORE_HOST_DEVICE static constexpr uint32_t pass_offset(uint32_t addr, int dr) {
    if constexpr (kSwizzled) return (addr ^ uint32_t(dr % 8 * 16)) + uint32_t(dr) * kRowBytes;
    else return addr + uint32_t(dr) * kRowBytes;
  }
};
// The tile of a head dim's rows (Q, K, V, dO).
template <class T, int D> using HeadTile = SmemTile<T, D, (D * sizeof(T)) % 128 == 0>;

} // namespace attncore::cuda
