// The Hopper backward's order of CTAs (plugins/core/src/cuda/cta_order.h), checked on the CPU: every
// (key tile, run) is taken once, within a group of runs the key tiles go in order with the runs side
// by side, and the groups follow one another, the last one smaller where the runs do not divide.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <utility>

#include "cta_order.h"

using attncore::cuda::CtaPlace;
using attncore::cuda::place_in_groups;

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
