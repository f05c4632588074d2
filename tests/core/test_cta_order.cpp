// The Hopper backward's order of CTAs (plugins/core/src/cuda/cta_order.h), checked on the CPU: every
// (key tile, run) is taken once, within a group of runs the key tiles go in order with the runs side
// by side, and the groups follow one another, the last one smaller where the runs do not divide; the
// last wave's tiles cut in parts cover each tile's rows once, and the count of CTAs a line of query
// rows waits for is the count that adds into it.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "cta_order.h"

using attncore::cuda::CtaPlace;
using attncore::cuda::place_in_groups;
using attncore::cuda::TailSplit;

TEST_CASE("the backward's CTAs in groups of runs: each (key tile, run) once, a group's tiles first-tile-first") {
  for (int32_t group_runs : {1, 4})
    for (int32_t tiles = 1; tiles <= 9; ++tiles)
      for (int32_t runs = 1; runs <= 11; ++runs) {
        CAPTURE(group_runs);
        CAPTURE(tiles);
        CAPTURE(runs);
        std::set<std::pair<int32_t, int32_t>> seen;
        int32_t out_of_range = 0, out_of_order = 0;
        CtaPlace before{-1, -1};
        for (int32_t launch = 0; launch < tiles * runs; ++launch) {
          const CtaPlace p = place_in_groups(launch, tiles, runs, group_runs);
          out_of_range += p.tile < 0 || p.tile >= tiles || p.run < 0 || p.run >= runs;
          seen.insert({p.tile, p.run});
          // In a group: tiles never go back; a new group starts at tile 0 with runs past the last.
          const bool same_group = before.run >= 0 && p.run / group_runs == before.run / group_runs;
          if (same_group) out_of_order += p.tile < before.tile;
          else out_of_order += p.tile != 0 || p.run / group_runs != (before.run < 0 ? 0 : before.run / group_runs + 1);
          before = p;
        }
        CHECK(out_of_range == 0);
        CHECK(out_of_order == 0);
        CHECK(seen.size() == size_t(tiles) * size_t(runs));
      }
  // Four runs of 3 tiles then a group of 1 run: (0,0) (0,1) (0,2) (0,3) (1,0) ... (2,3), then (0,4) (1,4) (2,4).
  const CtaPlace p = place_in_groups(5, 3, 5, 4), q = place_in_groups(12, 3, 5, 4), r = place_in_groups(14, 3, 5, 4);
  CHECK((p.tile == 1 && p.run == 1));
  CHECK((q.tile == 0 && q.run == 4));
  CHECK((r.tile == 2 && r.run == 4));
}

TEST_CASE("the last wave in parts: where it splits, and how many parts") {
  using attncore::cuda::tail_split;
  // B=4 H=32 S=16384 at 128 keys a tile on 132 SMs: 16384 CTAs, 124 waves and 16 over; 8 parts of 16.
  const TailSplit s = tail_split(128, 32, 4, 256, 132);
  CHECK(s.tail == 16);
  CHECK(s.parts == 8);
  CHECK(s.whole == 16384 - 16);
  CHECK(tail_split(128, 32, 4, 64, 132).parts == 4);  // no part shorter than kMinPartSteps
  CHECK(tail_split(132, 50, 1, 256, 132).parts == 1); // whole waves
  CHECK(tail_split(10, 67, 1, 256, 132).tail == 10);  // 670 = 5 x 132 + 10
  CHECK(tail_split(10, 67, 1, 256, 132).parts == 13);
  CHECK(tail_split(1, 350, 1, 256, 132).parts == 1);  // 86 over: more than half the SMs
  CHECK(tail_split(20, 10, 1, 256, 132).parts == 1);  // under two waves: none to fill
  CHECK(tail_split(1, 462, 1, 256, 132).parts == 1);  // 66 over: past kMaxTailTiles
  CHECK(tail_split(1, 456, 1, 256, 132).parts == 2);  // 60 over
  CHECK(tail_split(1, 397, 1, 256, 132).parts == 16); // one over: as many parts as its rows allow
}

TEST_CASE("the last wave in parts: every tile's rows once, and each line's count of CTAs") {
  using attncore::cuda::ctas_of_line;
  using attncore::cuda::part_of_rows;
  using attncore::cuda::place_with_tail;
  using attncore::cuda::TailPlace;
  for (const auto& [tiles, runs, batch, sms] : std::vector<std::tuple<int32_t, int32_t, int32_t, int32_t>>{
           {128, 32, 4, 132}, {7, 3, 5, 25}, {5, 2, 3, 7}, {9, 1, 4, 16}, {2, 3, 4, 10}})
    for (const int32_t steps : {16, 37, 256}) {
      CAPTURE(tiles);
      CAPTURE(runs);
      CAPTURE(batch);
      CAPTURE(steps);
      const int64_t ctas = int64_t(tiles) * runs * batch;
      const TailSplit s = attncore::cuda::tail_split(tiles, runs, batch, steps, sms);
      const int64_t whole = s.whole, grid = whole + int64_t(s.tail) * s.parts;
      std::map<std::tuple<int32_t, int32_t, int32_t>, std::vector<int32_t>> covered;  // query steps a tile's CTAs walk
      std::map<int64_t, int32_t> adding;                                              // CTAs a line
      int32_t bad = 0;
      for (int64_t launch = 0; launch < grid; ++launch) {
        const TailPlace p = place_with_tail(launch, s);
        bad += p.tile < 0 || p.tile >= tiles || p.run < 0 || p.run >= runs || p.batch < 0 || p.batch >= batch;
        bad += (launch < whole) != (p.slot < 0) || p.part < 0 || p.part >= s.parts;
        int32_t begin = 0, end = steps;
        if (p.slot >= 0) part_of_rows(begin, end, p.part, s.parts);
        std::vector<int32_t>& c = covered[{p.batch, p.run, p.tile}];
        c.resize(steps);
        for (int32_t r = begin; r < end; ++r) ++c[r];
        ++adding[int64_t(p.batch) * runs + p.run];
      }
      CHECK(bad == 0);
      CHECK(covered.size() == size_t(ctas));
      int32_t not_once = 0;
      for (const auto& [tile, c] : covered)
        for (int32_t n : c) not_once += n != 1;
      CHECK(not_once == 0);
      int32_t miscounted = 0;
      for (const auto& [line, n] : adding) miscounted += n != ctas_of_line(line, s);
      CHECK(miscounted == 0);
      CHECK(adding.size() == size_t(runs) * batch);
      if (steps == 256) CHECK(s.parts > 1);  // (each shape splits where its rows allow)
    }
}
