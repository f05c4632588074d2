// The mma.sync kernels' shared-tile layout (plugins/core/src/cuda/smem_tile.h), checked on the CPU:
// every fragment address the kernels form from a lane's address made once equals the address of
// the element the lane must read, ldmatrix's 8 rows never share a bank group, and copies fill whole
// rows. (A swizzled backward once added a warp's column to a lane's swizzled chunk at
// D = 64, which leaves the line: GPU tests caught it; this catches it without a GPU.)
#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <string>

#include "smem_tile.h"

using attncore::cuda::HeadTile;
using attncore::cuda::SmemTile;

namespace {

using Element = std::uint16_t; // bf16 and fp16: only the size matters
constexpr uint32_t kBase = 3 * 1024; // a tile's shared address: 128-byte aligned

struct Lane {
  int row, col; // the element (row, col..col+7) whose address the lane gives ldmatrix
};
// The three ldmatrix patterns of smem_tile.h, as element coordinates.
Lane pattern_a(int lane) { return {lane & 15, (lane >> 4) * 8}; }
Lane pattern_nk(int lane) { return {(lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8}; }
Lane pattern_kn(int lane) { return {(lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8}; }

// For a warp whose fragments start at (row0, col0), col0 a multiple of kColStep, and every fragment
// (row, col) the kernels load from there (col below kColStep, or below the row for col0 = 0):
// at(at_cols(tile + row0 bytes + lane_x)) is the address of the lane's element. x2 loads of
// lane_kn (lanes 0-15) may step by 8 columns.
template <class Tile, int kColStep> int wrong_addresses() {
  int wrong = 0;
  const auto check = [&](uint32_t lane_offset, Lane l, int row0, int col0, int col_step, int col_end) {
    const uint32_t lane_addr = Tile::template at_cols<kColStep>(kBase + Tile::bytes(row0) + lane_offset, col0);
    for (int row = 0; row < 64; row += 8)
      for (int col = 0; col < col_end; col += col_step)
        if (Tile::at(lane_addr, row, col) != kBase + Tile::offset(row0 + l.row + row, col0 + l.col + col)) ++wrong;
  };
  for (int lane = 0; lane < 32; ++lane)
    for (int row0 = 0; row0 < 64; row0 += 16) {
      // From column 0 over the whole row (the forward, S^T's products, the row-wise loads).
      check(Tile::lane_a(lane), pattern_a(lane), row0, 0, 16, Tile::kWidth);
      check(Tile::lane_nk(lane), pattern_nk(lane), row0, 0, 16, Tile::kWidth);
      check(Tile::lane_kn(lane), pattern_kn(lane), row0, 0, lane < 16 ? 8 : 16, Tile::kWidth);
      // From a warp's column col0 (dV, dK, dQ: kColStep columns a warp).
      for (int col0 = 0; col0 < Tile::kWidth; col0 += kColStep)
        check(Tile::lane_kn(lane), pattern_kn(lane), row0, col0, lane < 16 ? 8 : 16, kColStep);
    }
  return wrong;
}

// The 8 row addresses of every ldmatrix matrix (rows r0..r0+7 at one column) in distinct 16-byte
// bank groups of a 128-byte line, and every row's chunks a permutation of the row's own bytes.
template <class Tile> void check_banks_and_rows() {
  for (int r0 = 0; r0 < 64; r0 += 8)
    for (int col = 0; col < Tile::kWidth; col += 8) {
      std::set<uint32_t> groups;
      for (int i = 0; i < 8; ++i) groups.insert(Tile::offset(r0 + i, col) / 16 % 8);
      CHECK(groups.size() == 8);
    }
  for (int r = 0; r < 16; ++r) {
    std::set<uint32_t> chunks;
    for (int col = 0; col < Tile::kWidth; col += 8) {
      const uint32_t at = Tile::offset(r, col);
      CHECK(at >= Tile::bytes(r));
      CHECK(at + 16 <= Tile::bytes(r) + Tile::kWidth * sizeof(Element));
      chunks.insert(at);
    }
    CHECK(chunks.size() == size_t(Tile::kWidth / 8));
  }
  // A copy's passes: from (r, c) to (r + dr, c), dr a multiple of 4.
  for (int r = 0; r < 8; ++r)
    for (int col = 0; col < Tile::kWidth; col += 8)
      for (int dr = 4; dr <= 32; dr += 4)
        CHECK(Tile::pass_offset(kBase + Tile::offset(r, col), dr) == kBase + Tile::offset(r + dr, col));
}

} // namespace

TEST_CASE("shared tiles: D = 64, 128, 256 swizzled, 80 and 96 padded") {
  CHECK(HeadTile<Element, 64>::kXor);
  CHECK(HeadTile<Element, 128>::kXor);
  CHECK(HeadTile<Element, 256>::kXor);
  CHECK_FALSE(HeadTile<Element, 80>::kXor);
  CHECK_FALSE(HeadTile<Element, 96>::kXor);
  CHECK(HeadTile<Element, 128>::bytes(1) == 256);
  CHECK(HeadTile<Element, 96>::bytes(1) == 208);
}

TEST_CASE("shared tiles: fragment addresses made once equal the elements' addresses") {
  // The warps' column steps the backward uses (kOutCols): D / 2, D / 4 at D = 256.
  CHECK(wrong_addresses<HeadTile<Element, 64>, 32>() == 0);
  CHECK(wrong_addresses<HeadTile<Element, 128>, 64>() == 0);
  CHECK(wrong_addresses<HeadTile<Element, 256>, 64>() == 0);
  CHECK(wrong_addresses<HeadTile<Element, 80>, 40>() == 0);
  CHECK(wrong_addresses<HeadTile<Element, 96>, 48>() == 0);
  CHECK(wrong_addresses<SmemTile<Element, 64, false>, 16>() == 0); // P^T and dS^T
  CHECK(wrong_addresses<SmemTile<Element, 128, false>, 16>() == 0);
}

TEST_CASE("shared tiles: the swizzle's preconditions are needed (adding a warp's column inside a line is wrong)") {
  // What the first swizzled backward did at D = 64: the lane's address plus the column's offset.
  using Tile = HeadTile<Element, 64>;
  int wrong = 0;
  for (int lane = 0; lane < 32; ++lane) {
    const Lane l = pattern_kn(lane);
    if (kBase + Tile::lane_kn(lane) + Tile::offset(0, 32) != kBase + Tile::offset(l.row, 32 + l.col)) ++wrong;
  }
  CHECK(wrong > 0);
}

TEST_CASE("shared tiles: ldmatrix rows in distinct bank groups, copies fill whole rows") {
  check_banks_and_rows<HeadTile<Element, 64>>();
  check_banks_and_rows<HeadTile<Element, 128>>();
  check_banks_and_rows<HeadTile<Element, 256>>();
  check_banks_and_rows<HeadTile<Element, 80>>();
  check_banks_and_rows<HeadTile<Element, 96>>();
  check_banks_and_rows<SmemTile<Element, 64, false>>();
}
