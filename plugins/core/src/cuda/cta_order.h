// The order in which the Hopper backward's CTAs take their (key tile, run of query heads), and the
// last wave's key tiles cut into parts: plain integer arithmetic, so the CPU tests check it
// (tests/core/test_cta_order.cpp) where no GPU runs.
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

// The last partial wave of a full call's key tiles (one CTA an SM, each as long as the others), cut
// by rows: the last `tail` CTAs of the grid's order (tile fastest, then run, then batch) become
// `parts` CTAs each, so that the SMs the wave would leave idle take a share of its rows
// (docs/KERNELS.md, "The last wave in parts"). The grid is then one-dimensional: `whole` CTAs as
// before, then the tail's parts, a tile's side by side.
struct TailSplit {
  int32_t tiles = 0, runs = 0;  // the call's CTAs: tiles x runs x batches
  int64_t whole = 0;            // those launched whole, before the parts
  int32_t tail = 0, parts = 1;  // parts 1: no split, the grid as it was
};
// Tiles the tail holds at most: the workspace's sums are sized for them (tail_sums_bytes).
constexpr int32_t kMaxTailTiles = 64;
// Query steps a part walks at least: a part pays a key tile's start and end (about six steps,
// docs/KERNELS.md, "What a CTA's start and end cost") and its sums.
constexpr int64_t kMinPartSteps = 16;

// The split of a call's equal CTAs (`steps` query steps each) on `sms` SMs: the remainder of the
// last wave, where it is at most half the SMs, cut into as many parts as leave every part an SM.
ATTNCORE_CTA_ORDER_FN TailSplit tail_split(int32_t tiles, int32_t runs, int32_t batch, int64_t steps, int32_t sms) {
  const int64_t ctas = int64_t(tiles) * runs * batch;
  TailSplit s{tiles, runs, ctas, 0, 1};
  if (sms <= 0 || ctas < 2 * int64_t(sms)) return s;
  const int32_t tail = int32_t(ctas % sms);
  if (tail == 0 || tail > kMaxTailTiles) return s;
  int64_t parts = sms / tail;
  if (parts > steps / kMinPartSteps) parts = steps / kMinPartSteps;
  if (parts < 2) return s;
  return {tiles, runs, ctas - tail, tail, int32_t(parts)};
}

struct TailPlace {
  int32_t tile, run, batch;
  int32_t part, slot;  // slot: the tile's place in the tail (-1: a whole tile), part of its parts
};
// The CTA launched `launch`-th.
ATTNCORE_CTA_ORDER_FN TailPlace place_with_tail(int64_t launch, const TailSplit& s) {
  int64_t cta = launch;
  int32_t part = 0, slot = -1;
  if (launch >= s.whole) {
    slot = int32_t((launch - s.whole) / s.parts);
    part = int32_t((launch - s.whole) - int64_t(slot) * s.parts);
    cta = s.whole + slot;
  }
  const int64_t line = cta / s.tiles;  // (batch, run)
  return {int32_t(cta - line * s.tiles), int32_t(line % s.runs), int32_t(line / s.runs), part, slot};
}

// How many CTAs add into the rows of (batch, run) line `line` (= batch x runs + run): one a key
// tile, and s.parts for each of its tiles in the tail.
ATTNCORE_CTA_ORDER_FN int32_t ctas_of_line(int64_t line, const TailSplit& s) {
  const int64_t first = line * s.tiles, end = first + s.tiles;
  const int64_t from = first > s.whole ? first : s.whole;
  const int64_t in_tail = end > from ? end - from : 0;
  return int32_t(s.tiles + in_tail * (s.parts - 1));
}

// A key tile's query tiles [begin, end) cut in `parts` shares: share `part`'s bounds.
ATTNCORE_CTA_ORDER_FN void part_of_rows(int32_t& begin, int32_t& end, int32_t part, int32_t parts) {
  const int64_t n = end - begin;
  end = begin + int32_t(n * (part + 1) / parts);
  begin = begin + int32_t(n * part / parts);
}

}  // namespace attncore::cuda
