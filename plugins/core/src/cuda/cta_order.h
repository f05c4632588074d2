// The order in which the Hopper backward's CTAs take their (key tile, run of query heads): plain
// integer arithmetic, so the CPU tests check it (tests/core/test_cta_order.cpp) where no GPU runs.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ATTNCORE_CTA_ORDER_FN __host__ __device__ __forceinline__
#else
#define ATTNCORE_CTA_ORDER_FN inline
#endif

namespace attncore::cuda {

struct CtaPlace {
  int32_t tile, run;
};

// The CTA launched `launch`-th (x fastest) of a grid of `tiles` key tiles by `runs` runs, read as
// groups of `group_runs` runs (the last group may hold fewer): within a group the key tiles go in
// order, tile 0 first, the group's runs side by side. A bijection onto [0, tiles) x [0, runs).
ATTNCORE_CTA_ORDER_FN CtaPlace place_in_groups(int32_t launch, int32_t tiles, int32_t runs, int32_t group_runs) {
  const int32_t group = launch / (tiles * group_runs), r = launch - group * tiles * group_runs;
  const int32_t rest = runs - group * group_runs;
  const int32_t width = rest < group_runs ? rest : group_runs;
  const int32_t tile = r / width;
  return {tile, group * group_runs + (r - tile * width)};
}

}  // namespace attncore::cuda
