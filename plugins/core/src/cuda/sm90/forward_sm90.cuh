// Flash-attention forward on Hopper (sm_90a): warpgroup matrix products, bulk tensor copies and
// warp specialization, FlashAttention-3's structure, with every feature of the mma.sync kernel
// (forward.cuh): causal and windows on global positions, GQA, segments, block lists, fp32 partials.
//
// A CTA of three warpgroups owns kBlockM = 128 query rows of one (batch, head).
//  - Warpgroup 0, one thread, is the producer and the only walker of the key tiles. The copy engine
//    brings Q once, then the K and V tiles of every key tile the rows see into two rings of kStages
//    shared buffers; each copy completes on a transaction barrier (k_full, v_full), the tile's
//    TileStep rides with its K buffer, and a buffer is refilled once both consumers release it
//    (k_empty as soon as their scores are back, v_empty once P V is). Rows of V past a segment's
//    end inside the tensor are zeroed by the consumers before P V reads them.
//  - Warpgroups 1 and 2 are the consumers, 64 rows each. For every key tile:
//        S = Q K^T   (wgmma, Q and K in shared memory)
//        mask; the online-softmax step (softmax.cuh, the same code as the mma.sync kernel)
//        O += P V    (wgmma, P straight from the score registers, V in shared memory)
//    then release the buffer. The loop runs one tile ahead: the scores of tile n are exponentiated
//    while P V of tile n - 1 runs. At the end each consumer stages O / l in shared memory and the
//    copy engine writes it (one bulk store per column block, not scattered 4-byte stores).
// The producer gives most of its registers to the consumers (setmaxnreg): O, S and P of a d128
// consumer take 64 + 64 + 32 registers a thread.
// Two other configurations of the same kernel (Tiles, below): for short causal rows (pair_serves),
// one consumer and 64-column key tiles, two CTAs an SM, so one's start and store of O hide under the
// other's products; for long rows at d96 and d128 (wide_serves), 176-column key tiles; for long
// rows at d64 (three_serves), three consumers.
#pragma once

#include <cuda.h>

#include <cstring>

#include "../args.h"
#include "../device.cuh"
#include "../launch.h"
#include "../softmax.cuh"
#include "../tiles.cuh"
#include "hopper.cuh"
#include "tensor_map.h"
#include "wgmma_ops.cuh"

namespace attncore::cuda::sm90 {

// The forward's tile configurations:
//  - standard: one CTA an SM, two consumers of 64 rows sharing 128-column K/V tiles (64 at d256,
//    where O alone takes 128 registers a thread);
//  - pair, for short causal rows: one consumer and 64-column tiles, small enough (registers and
//    shared memory) that two CTAs share an SM, so that one's start and store of O run under the
//    other's products;
//  - wide, for long rows at d96 and d128: as standard with 176-column tiles (FlashAttention-3's width for
//    the full mask), so the work paid once a tile (barriers, row reductions, the rescale of O)
//    comes a quarter less often. Calls without block lists only (a tile is not a whole number of
//    64-column blocks).
//  - three, for d64: three consumers (192-row CTAs, 512 threads), where the softmax, not the
//    products, bounds a tile and more warps hide its latency. Calls without block lists only (a
//    CTA spans up to three 64-row query blocks).
enum class Tiles { standard, pair, wide, three };

template <class T, int D, Tiles kTiles = Tiles::standard> struct ForwardConfig {
  static constexpr bool kPair = kTiles == Tiles::pair;
  static constexpr int kConsumers = kPair ? 1 : kTiles == Tiles::three ? 3 : 2;
  static constexpr int kCtasPerSm = kPair ? 2 : 1;
  static constexpr int kThreads = (kConsumers + 1) * 128;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = kTiles == Tiles::wide ? 176 : D <= 128 && !kPair ? 128 : 64;
  static constexpr int kStages = 2;
  static constexpr int W = swizzle_cols(D);
  static constexpr int kSTiles = kBlockN / 8;
  static constexpr int kOTiles = D / 8;
  static constexpr int kF32Cols = D % 32 == 0 ? 32 : 16; // fp32 O staged in rows of 128 (or 64) bytes
  static constexpr uint32_t kQBytes = kBlockM * D * sizeof(T);
  static constexpr uint32_t kKVBytes = kBlockN * D * sizeof(T); // one of K or V
  // setmaxnreg: the launch gives each thread 65536 / (kThreads x kCtasPerSm) registers (168, 128).
  // 24 + 232 = 2 x 128; 24 + 2 x 240 = 3 x 168; 24 + 3 x 160 <= 4 x 128
  static constexpr int kProducerRegs = 24, kConsumerRegs = kPair ? 232 : kConsumers == 3 ? 160 : 240;
  // Where O is rescaled by the new maxima. At d64 and d80, where the softmax rather than the
  // products bounds a tile, right after the next tile's scores are issued (FlashAttention-3's
  // place), so that it runs under that product rather than between P V and the next scores: d64
  // +7% causal / +10% full at 8192 rows, d80 +3% (docs/KERNELS.md, "O rescaled under the next scores"). Elsewhere once P V
  // is back: the pair configuration lost 2.5% at d64, the standard one at d96-d128 was equal, and
  // the wide one spilled and lost 1-3.5%.
  static constexpr bool kRescaleUnderScores = D <= 80 && !kPair;
  // fp32 O (partials) staged in a buffer of its own where it fits beside Q and the K/V ring, so a
  // consumer stores its rows without waiting for the other to be done with Q and K; else over them.
  static constexpr bool kOwnF32Stage = kTiles == Tiles::standard && D <= 128;
  static constexpr uint32_t kF32StageBytes = kOwnF32Stage ? kConsumers * 64 * D * 4 : 0;
  static constexpr uint32_t kF32Stage = kQBytes + 2 * kStages * kKVBytes; // (its offset, 1024-aligned)
  static constexpr size_t kSmemBytes = 1024 /* alignment */ + kQBytes + 2 * kStages * kKVBytes + kF32StageBytes + 512;
  static_assert(D % 16 == 0 && D % W == 0, "head dim must be a multiple of 16");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles start on 1024-byte boundaries");
  static_assert(kSmemBytes * kCtasPerSm <= 227 * 1024, "must fit a Hopper SM");
  static_assert(kBlockN == 64 || kBlockN == 128 || kTiles == Tiles::wide, "key tiles of 64, 128 or 176 columns");
  static_assert(kConsumers * 64 * D * 4 <= kQBytes + 2 * kStages * kKVBytes, "fp32 O is staged over Q, K and V");
  static_assert(kConsumers < 3 || D == 64, "three consumers only where O and S leave room in 160 registers");
};

// A step of the walk over key tiles of kN columns: per query block of the CTA (at most two), which
// 64-column halves of the tile a block list lists, and which of those need element masking.
struct TileStep {
  int32_t c0;
  uint32_t listed[2], masked[2];
  bool cross; // the tile runs past the region's last column
};

// Key tiles of kN (64, 128; 176 and 192: below) columns, built from the 64-column walk of the
// mma.sync kernels (tiles.cuh): a 128-column tile may hold two 64-column blocks of a block list, of
// which one or both are listed for a query block.
// Tiles that are not whole 64-column blocks (the wide configuration's), or wider than two (the FP8
// forward's 192), are walked directly, at their own width, over the interval the mask allows (no
// block lists).
template <int kN> struct TileWalk {
  static constexpr bool kDirect = kN % 64 != 0 || kN > 128;
  KvWalk<kDirect ? kN : 64> inner;
  KvStep pending;
  bool have_pending = false;

  __device__ bool next(TileStep& t, const MaskArgs& mask, const Region& reg, int32_t r0, int32_t r1,
                       const BlockArgs& bl) {
    KvStep s;
    if constexpr (kDirect) {
      if (!inner.next(s, mask, reg, r0, r1, bl)) return false;
      t.c0 = s.c0;
      t.listed[0] = t.listed[1] = (1u << ((kN + 63) / 64)) - 1;
      t.masked[0] = t.masked[1] = s.masked[0] ? t.listed[0] : 0u;
      t.cross = s.cross;
      return true;
    }
    if (have_pending) {
      s = pending;
      have_pending = false;
    } else if (!inner.next(s, mask, reg, r0, r1, bl)) {
      return false;
    }
    const int32_t tile = (s.c0 - reg.col_begin) / kN;
    t.c0 = reg.col_begin + tile * kN;
    t.listed[0] = t.listed[1] = t.masked[0] = t.masked[1] = 0;
    add(t, s);
    if (kN > 64 && inner.next(pending, mask, reg, r0, r1, bl)) {
      if ((pending.c0 - reg.col_begin) / kN == tile) add(t, pending);
      else have_pending = true;
    }
    t.cross = t.c0 + kN > reg.col_end;
    return true;
  }
  __device__ static void add(TileStep& t, const KvStep& s) {
    const int half = (s.c0 - t.c0) / 64;
    t.listed[0] |= uint32_t(s.active[0]) << half;
    t.listed[1] |= uint32_t(s.active[1]) << half;
    t.masked[0] |= uint32_t(s.masked[0]) << half;
    t.masked[1] |= uint32_t(s.masked[1]) << half;
  }
};

// -inf for the pairs of a consumer's score tile that it must not see: columns past the region,
// columns of 64-column halves that are not listed, and pairs the Mask hides in the halves that
// need element masking (bit h of `listed` / `masked`: half h of the tile). Each of the lane's two
// rows gets a band of column offsets per half, made once: element (row, 8 j + 2 (lane % 4) + e % 2)
// is kept iff 8 j + e % 2 lies in its row's band for half j / 8. (Not row_band: built from it, two
// calls a row, the Hopper forward measured 0.5-1.8% slower.)
template <int kSTiles>
__device__ void mask_tile(float (&s)[1][kSTiles][4], const MaskArgs& mask, const Region& reg, int32_t row0, int32_t c0,
                          uint32_t listed, uint32_t masked, int lane) {
  constexpr int kHalves = (kSTiles + 7) / 8;
  const int32_t base = reg.diff(row0, c0); // diff of (row0, c0); (row, col) adds col - row
  const int32_t last = reg.col_end - c0 - (lane & 3) * 2 - 1; // the last offset inside the region
  Band band[kHalves][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const Band b = band_from(mask, base + (lane & 3) * 2 - (lane >> 2) - 8 * h);
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      Band x = !((listed >> half) & 1u) ? empty_band() : ((masked >> half) & 1u) ? b : full_band();
      x.hi = min(x.hi, last);
      band[half][h] = x;
    }
  }
#pragma unroll
  for (int j = 0; j < kSTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (!in_band(band[j / 8][e >> 1], j * 8 + (e & 1))) s[0][j][e] = -INFINITY;
}

// O / l of a consumer's rows into shared memory, laid out as the copy engine loads a box of 64 rows
// x kCols elements E (column blocks `block_bytes` apart, swizzled rows); their LSE into the tensor.
template <class E, int kCols, class Softmax>
__device__ void stage_o(Softmax& sm, const AttnArgs& a, int batch, int head, int32_t r_lo, int32_t row0,
                        int32_t row_end, int lane, uint32_t base, uint32_t block_bytes) {
  constexpr int kRow16 = kCols * int(sizeof(E)) / 2; // the row in 16-bit elements, as swizzled_offset counts
  constexpr int kChunk = 16 / int(sizeof(E));        // elements in a 16-byte chunk
  sm.finish(a, batch, head, row0, row_end, lane, [&](int32_t r, int col, float x0, float x1) {
    const int c = col % kCols;
    const uint32_t addr = base + uint32_t(col / kCols) * block_bytes + swizzled_offset<kRow16>(r - r_lo, c / kChunk) +
                          uint32_t(c % kChunk) * sizeof(E);
    if constexpr (sizeof(E) == 4) st_shared_v2(addr, x0, x1);
    else st_shared_b32(addr, pack2<E>(x0, x1));
  });
}

// The CTA's shared memory: Q, the rings of K and V tiles, the barriers, and the TileStep of each K
// buffer.
template <class T, int D, Tiles kTiles> struct ForwardShared {
  unsigned char* base; // 1024-aligned; O is staged over it (store_o)
  T* q;
  T* k; // kStages tiles
  T* v; // kStages tiles
  uint64_t *q_full, *k_full, *v_full, *k_empty, *v_empty;
  TileStep* steps; // the tile in each K buffer
};

template <class T, int D, Tiles kTiles>
__device__ __forceinline__ ForwardShared<T, D, kTiles> forward_shared(unsigned char* smem_raw) {
  using C = ForwardConfig<T, D, kTiles>;
  unsigned char* smem = align_smem<1024>(smem_raw);
  ForwardShared<T, D, kTiles> sh;
  sh.base = smem;
  sh.q = reinterpret_cast<T*>(smem);
  sh.k = reinterpret_cast<T*>(smem + C::kQBytes);
  sh.v = reinterpret_cast<T*>(smem + C::kQBytes + C::kStages * C::kKVBytes);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + C::kF32Stage + C::kF32StageBytes);
  sh.q_full = bars;
  sh.k_full = bars + 1;
  sh.v_full = sh.k_full + C::kStages;
  sh.k_empty = sh.v_full + C::kStages;
  sh.v_empty = sh.k_empty + C::kStages;
  sh.steps = reinterpret_cast<TileStep*>(sh.v_empty + C::kStages);
  return sh;
}

// The CTA's query rows [m0, m1), the region they lie in, and, with a block list, their first query
// block.
struct ForwardRows {
  Region reg;
  int32_t m0, m1;
  bool blocks; // a block list
  int32_t qb0;
};

// False for a CTA past the last segment's rows.
template <class C> __device__ __forceinline__ bool locate_rows(const AttnArgs& a, ForwardRows& rows) {
  const int32_t x = int32_t(gridDim.x - 1 - blockIdx.x); // last tiles first: causal ones are heaviest
  if (a.nseg > 0) {
    int32_t seg, tile;
    if (!locate_tile(a.segs, a.nseg, x, C::kBlockM, true, seg, tile)) return false;
    rows.reg = segment_region(a.segs[seg]);
    rows.m0 = rows.reg.row_begin + tile * C::kBlockM;
  } else {
    rows.reg = whole_call(a.mask, a.seqlen_q, a.seqlen_kv);
    rows.m0 = x * C::kBlockM;
  }
  rows.m1 = min(rows.m0 + C::kBlockM, rows.reg.row_end);
  rows.blocks = a.blocks.heads > 0;
  rows.qb0 = rows.blocks ? rows.m0 / a.blocks.block_q : 0;
  return true;
}

// The barriers of a forward's shared memory (Q's, and a full and an empty one for each stage of the K
// and V rings), for either kernel's layout.
template <int kStages, int kConsumers, class Shared> __device__ __forceinline__ void init_barriers(const Shared& sh) {
  barrier_init(sh.q_full, 1);
  for (int s = 0; s < kStages; ++s) {
    barrier_init(&sh.k_full[s], 1);
    barrier_init(&sh.v_full[s], 1);
    barrier_init(&sh.k_empty[s], kConsumers * 4); // one arrival per consumer warp
    barrier_init(&sh.v_empty[s], kConsumers * 4);
  }
  barrier_init_fence();
}

// The walk over the key tiles the CTA's rows see: a block list's, or the interval the mask allows.
template <int kN>
__device__ __forceinline__ void start_walk(TileWalk<kN>& walk, const AttnArgs& a, const ForwardRows& rows, int head) {
  if (rows.blocks) {
    const int32_t row = (a.blocks.heads == 1 ? 0 : head) * a.blocks.num_q_blocks;
    walk.inner.init_blocks(a.blocks, row + rows.qb0, row + (rows.m1 - 1) / a.blocks.block_q);
  } else {
    walk.inner.init_interval(a.mask, rows.reg, rows.m0, rows.m1);
  }
}

// Q once (with the maps' prefetches).
template <class T, int D, Tiles kTiles>
__device__ __forceinline__ void load_q(const ForwardShared<T, D, kTiles>& sh, const CUtensorMap& q_map,
                                       const CUtensorMap& k_map, const CUtensorMap& v_map, int32_t m0, int head,
                                       int batch) {
  using C = ForwardConfig<T, D, kTiles>;
  constexpr int W = C::W;
  tma_prefetch_map(&q_map);
  tma_prefetch_map(&k_map);
  tma_prefetch_map(&v_map);
  barrier_expect_bytes(sh.q_full, C::kQBytes);
  for (int cb = 0; cb < D / W; ++cb)
    tma_load_4d(sh.q + cb * C::kBlockM * W, &q_map, sh.q_full, cb * W, m0, head, batch);
}

// K and V of tile t into stage s, V once the consumers are done with the stage's last V.
template <class T, int D, Tiles kTiles>
__device__ __forceinline__ void load_kv(const ForwardShared<T, D, kTiles>& sh, const CUtensorMap& k_map,
                                        const CUtensorMap& v_map, uint32_t s, uint32_t phase, const TileStep& t,
                                        int kv_head, int batch) {
  using C = ForwardConfig<T, D, kTiles>;
  constexpr int W = C::W;
  sh.steps[s] = t; // published by the arrive below (release), read after the consumers' wait
  T* k_tile = sh.k + s * (C::kKVBytes / sizeof(T));
  T* v_tile = sh.v + s * (C::kKVBytes / sizeof(T));
  barrier_expect_bytes(&sh.k_full[s], C::kKVBytes);
  for (int cb = 0; cb < D / W; ++cb)
    tma_load_4d(k_tile + cb * C::kBlockN * W, &k_map, &sh.k_full[s], cb * W, t.c0, kv_head, batch);
  barrier_wait(&sh.v_empty[s], phase ^ 1);
  barrier_expect_bytes(&sh.v_full[s], C::kKVBytes);
  for (int cb = 0; cb < D / W; ++cb)
    tma_load_4d(v_tile + cb * C::kBlockN * W, &v_map, &sh.v_full[s], cb * W, t.c0, kv_head, batch);
}

// The producer, one thread, the only walker of the key tiles: Q once, then K and V of every tile the
// rows see into the rings, each tile's TileStep riding with its K buffer. (walk and t are the
// kernel's: as this function's own, the wide configuration's kernels compiled to other machine code.)
template <class T, int D, Tiles kTiles>
__device__ __forceinline__ void produce_tiles(const ForwardShared<T, D, kTiles>& sh, const AttnArgs& a,
                                              const ForwardRows& rows, const CUtensorMap& q_map,
                                              const CUtensorMap& k_map, const CUtensorMap& v_map, int head,
                                              int kv_head, int batch,
                                              TileWalk<ForwardConfig<T, D, kTiles>::kBlockN>& walk, TileStep& t) {
  using C = ForwardConfig<T, D, kTiles>;
  start_walk(walk, a, rows, head);
  load_q(sh, q_map, k_map, v_map, rows.m0, head, batch);
  for (uint32_t step = 0;; ++step) {
    const uint32_t s = step % C::kStages, phase = (step / C::kStages) & 1;
    const bool more = walk.next(t, a.mask, rows.reg, rows.m0, rows.m1, a.blocks);
    barrier_wait(&sh.k_empty[s], phase ^ 1);
    if (!more) { // the end: a step with no tile
      sh.steps[s].c0 = -1;
      barrier_arrive(&sh.k_full[s]);
      break;
    }
    load_kv(sh, k_map, v_map, s, phase, t, kv_head, batch);
  }
}

// Which of a key tile's pairs a consumer warpgroup (rows [r_lo, r_hi)) must hide: the 64-column
// halves a block list does not list for its query block (`list`), the halves that need element
// masking, the columns past the region.
struct TileUse {
  bool needs_mask; // (warp-uniform: it decides a branch between the products)
  uint32_t listed, masked;
};

template <int kN>
__device__ __forceinline__ TileUse tile_use(const TileStep& t, const AttnArgs& a, const ForwardRows& rows, int32_t r_lo,
                                            int32_t r_hi, bool has_rows, int list) {
  constexpr uint32_t kAll = (1u << ((kN + 63) / 64)) - 1; // every 64-column part of a tile
  TileUse u;
  if (rows.blocks) {
    u.listed = list ? t.listed[1] : t.listed[0];
    u.masked = list ? t.masked[1] : t.masked[0];
  } else {
    u.listed = kAll;
    u.masked = has_rows && all_visible(a.mask, rows.reg.row_pos(r_lo), rows.reg.row_pos(r_hi - 1),
                                       rows.reg.col_pos(t.c0), rows.reg.col_pos(t.c0 + kN - 1))
                   ? 0u
                   : kAll;
  }
  u.needs_mask = warp_uniform(u.listed != kAll || u.masked != 0 || t.cross);
  return u;
}

// A consumer warpgroup's rows and shared-memory descriptors, made once: a k-step or a stage only
// adds a constant to a descriptor.
struct ForwardOperands {
  int wg, warp_in_wg;
  int32_t r_lo, r_hi; // this warpgroup's rows
  bool has_rows;
  int list; // the query block of a block list (selects below, not list[...])
  uint64_t q_desc, k_desc, v_desc;
};

template <class T, int D, Tiles kTiles>
__device__ __forceinline__ ForwardOperands forward_operands(const ForwardShared<T, D, kTiles>& sh, const AttnArgs& a,
                                                            const ForwardRows& rows, int warp, int group) {
  using C = ForwardConfig<T, D, kTiles>;
  constexpr int W = C::W;
  ForwardOperands op;
  op.wg = group - 1;
  op.warp_in_wg = warp % 4;
  op.r_lo = rows.m0 + 64 * op.wg;
  op.r_hi = min(op.r_lo + 64, rows.m1);
  op.has_rows = op.r_hi > op.r_lo;
  op.list = rows.blocks && op.r_lo / a.blocks.block_q != rows.qb0 ? 1 : 0;
  op.q_desc = desc_k_major<W>(sh.q, C::kBlockM, 64 * op.wg);
  op.k_desc = desc_k_major<W>(sh.k, C::kBlockN, 0);
  op.v_desc = desc_mn_major<W>(sh.v, C::kBlockN);
  return op;
}

// A consumer's registers: S (issued, the hardware's until the caller waits), the softmax's state
// with O, P as A fragments of the second product, and O's rescale.
template <class T, int D, Tiles kTiles> struct ForwardRegs {
  using C = ForwardConfig<T, D, kTiles>;
  float sc[1][C::kSTiles][4];
  OnlineSoftmax<1, C::kOTiles> sm;
  uint32_t p[C::kBlockN / 16][4];
  float alpha[1][2];
};

// The steps of a consumer warpgroup (64 of the CTA's rows) over a key tile, on its operands and
// registers. The kernel runs them in its tile loop: with the loop in a function of its own, the wide
// configuration's kernels compiled to other machine code.
template <class T, int D, Tiles kTiles> struct ForwardConsumer {
  using C = ForwardConfig<T, D, kTiles>;
  static constexpr int W = C::W;
  static constexpr uint32_t kStageStep = desc_offset(C::kKVBytes);

  using Use = TileUse;

  const ForwardShared<T, D, kTiles>& sh;
  const AttnArgs& a;
  const ForwardRows& rows;
  const ForwardOperands& op;
  ForwardRegs<T, D, kTiles>& r;
  const int &tid, &lane;

  // The tile of step `step`, once its K is in: false at the end.
  __device__ __forceinline__ bool next_tile(uint32_t step, TileStep& t) {
    barrier_wait(&sh.k_full[step % C::kStages], (step / C::kStages) & 1);
    t = sh.steps[step % C::kStages];
    return warp_uniform(t.c0 >= 0);
  }

  __device__ __forceinline__ Use use_of(const TileStep& t) {
    return tile_use<C::kBlockN>(t, a, rows, op.r_lo, op.r_hi, op.has_rows, op.list);
  }

  // S = Q K^T, issued.
  __device__ __forceinline__ void issue_scores(uint32_t s) {
    const uint64_t k_stage = op.k_desc + s * kStageStep;
    wgmma_fence();
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16)
      Wgmma<T, C::kBlockN>::template ss<0, 0>(r.sc[0], op.q_desc + k_major_step<W>(C::kBlockM, k0),
                                              k_stage + k_major_step<W>(C::kBlockN, k0), k0 > 0);
    wgmma_commit();
  }

  // O += P V, issued.
  __device__ __forceinline__ void issue_pv(uint32_t s) {
    const uint64_t v_stage = op.v_desc + s * kStageStep;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk)
      Wgmma<T, D>::template rs<1>(r.sm.o[0], r.p[kk], v_stage + mn_major_step<W>(16 * kk), true);
    wgmma_commit();
  }

  // The scores back: mask, the softmax update (O untouched), alpha for O.
  __device__ __forceinline__ void softmax_update(const TileStep& t, const Use& u) {
    fence_registers(r.sc[0]);
    if (u.needs_mask)
      mask_tile(r.sc, a.mask, rows.reg, op.r_lo + 16 * op.warp_in_wg, t.c0, u.listed, u.masked, lane);
    r.sm.update(r.sc, a.scale_log2, r.alpha);
  }

  __device__ __forceinline__ void to_p() {
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk) c_to_a<T>(r.p[kk], r.sc[0][2 * kk], r.sc[0][2 * kk + 1]);
  }

  // Rows of V past a segment's end are zeroed before P V reads them (zero_rows_past): K's are
  // harmless (their scores are masked by a select), V's would reach O as 0 x V. Rare: one tile a
  // segment end; both consumers zero and meet at named barrier 1.
  __device__ __forceinline__ int v_rows(const TileStep& t) {
    return warp_uniform(t.c0 + C::kBlockN > rows.reg.col_end && rows.reg.col_end < a.seqlen_kv
                            ? int(rows.reg.col_end - t.c0)
                            : C::kBlockN);
  }
  __device__ __forceinline__ void clean_v(uint32_t s, int v_rows) {
    if (v_rows < C::kBlockN) {
      zero_rows_past<W, D, C::kBlockN>(sh.v + s * (C::kKVBytes / sizeof(T)), v_rows, tid - 128, C::kConsumers * 128);
      named_barrier_sync(1, C::kConsumers * 128);
    }
  }

  __device__ __forceinline__ void release(uint64_t* empty) {
    __syncwarp();
    if (lane == 0) barrier_arrive(empty);
  }

  // O leaves through the copy engine where it can (o_bulk): staged in shared memory as a load lays
  // a tile, then one bulk store per column block, not 32 scattered stores a thread.
  //  - In dtype: in this warpgroup's rows of Q's buffer, which its last product has read.
  //  - In fp32 (partials): twice the bytes, in a buffer of its own (kOwnF32Stage); else over Q's and
  //    the K/V buffers, once both consumers are done with them (and so the producer is too: every
  //    copy it issued has been waited for).
  // Only blocks of 64 whole rows, or blocks that end at the tensor's end (the copy engine drops
  // rows past it): rows past a segment's end belong to another segment.
  __device__ __forceinline__ void store_o(const CUtensorMap& o_map, bool o_bulk, int head, int batch) {
    const int32_t row0 = op.r_lo + 16 * op.warp_in_wg;
    if (o_bulk && a.o_fp32 && !C::kOwnF32Stage) named_barrier_sync(2, C::kConsumers * 128);
    if (o_bulk && op.has_rows && warp_uniform(op.r_lo + 64 <= rows.reg.row_end || rows.reg.row_end == a.seqlen_q)) {
      const unsigned char* stage;
      uint32_t block_bytes;
      if (a.o_fp32) {
        stage = sh.base + (C::kOwnF32Stage ? C::kF32Stage : 0) + op.wg * 64 * D * 4;
        block_bytes = 64 * C::kF32Cols * 4;
        stage_o<float, C::kF32Cols>(r.sm, a, batch, head, op.r_lo, row0, rows.m1, lane, smem_addr(stage), block_bytes);
      } else {
        stage = sh.base + 64 * op.wg * W * sizeof(T);
        block_bytes = C::kBlockM * W * sizeof(T);
        stage_o<T, W>(r.sm, a, batch, head, op.r_lo, row0, rows.m1, lane, smem_addr(stage), block_bytes);
      }
      fence_async_shared();
      named_barrier_sync(3 + op.wg, 128);
      if (op.warp_in_wg == 0 && lane == 0) {
        const int cols = a.o_fp32 ? C::kF32Cols : W;
        for (int cb = 0; cb < D / cols; ++cb)
          tma_store_4d(&o_map, stage + cb * block_bytes, cb * cols, op.r_lo, head, batch);
        bulk_commit();
        bulk_wait_read(); // the CTA's shared memory must outlive the copy's reads
      }
    } else {
      r.sm.template store<T>(a, batch, head, row0, rows.m1, lane);
    }
  }
};

template <class T, int D, Tiles kTiles>
__global__ void __launch_bounds__(ForwardConfig<T, D, kTiles>::kThreads, ForwardConfig<T, D, kTiles>::kCtasPerSm)
    flash_forward_sm90_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                              const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                              const __grid_constant__ AttnArgs a, bool o_bulk) {
#if ATTNCORE_SM90_DEVICE
  using C = ForwardConfig<T, D, kTiles>;
  // 1. Shared memory, this thread's role, the CTA's rows, the barriers.
  extern __shared__ unsigned char smem_raw[];
  const ForwardShared<T, D, kTiles> sh = forward_shared<T, D, kTiles>(smem_raw);
  const int tid = threadIdx.x, warp = warp_uniform(int(tid / 32)), lane = tid % 32, group = warp / 4;
  const int head = blockIdx.y, batch = blockIdx.z, kv_head = head / a.group;
  ForwardRows rows;
  if (!locate_rows<C>(a, rows)) return;
  if (tid == 0) init_barriers<C::kStages, C::kConsumers>(sh);
  __syncthreads();

  // 2. The producer: Q, then K and V of every tile the walk yields.
  if (group == 0) {
    regs_dealloc<C::kProducerRegs>();
    if (warp == 0 && lane == 0) {
      TileWalk<C::kBlockN> walk;
      TileStep t;
      produce_tiles(sh, a, rows, q_map, k_map, v_map, head, kv_head, batch, walk, t);
    }
    return;
  }

  // 3. The consumers: for every tile S = Q K^T, the softmax, O += P V (ForwardConsumer's steps).
  regs_alloc<C::kConsumerRegs>();
  const ForwardOperands op = forward_operands(sh, a, rows, warp, group);
  ForwardRegs<T, D, kTiles> r;
  using Consumer = ForwardConsumer<T, D, kTiles>;
  Consumer consumer{sh, a, rows, op, r, tid, lane};
  // Both warpgroups compute every tile the walk yields (at least one of them sees part of it; the
  // mask hides the rest): a product skipped on a run-time condition makes ptxas wait after every
  // product (C7515). The loop runs one tile ahead inside the warpgroup: the scores of tile n are
  // exponentiated while the tensor cores still add P V of tile n - 1 into O.
  r.sm.init();
  barrier_wait(sh.q_full, 0);
  TileStep t;
  if (consumer.next_tile(0, t)) {
    consumer.issue_scores(0);
    wgmma_wait<0>();
    consumer.release(&sh.k_empty[0]);
    consumer.softmax_update(t, consumer.use_of(t)); // O is still 0: no rescale
    consumer.to_p();
    uint32_t s = 0, phase = 0; // the stage of the tile whose P V is next
    int pv_rows = consumer.v_rows(t);
    for (uint32_t step = 1; consumer.next_tile(step, t); ++step) {
      const uint32_t sn = step % C::kStages, pn = (step / C::kStages) & 1;
      const typename Consumer::Use u = consumer.use_of(t);
      consumer.issue_scores(sn);
      if constexpr (C::kRescaleUnderScores) r.sm.rescale(r.alpha);
      barrier_wait(&sh.v_full[s], phase);
      consumer.clean_v(s, pv_rows);
      consumer.issue_pv(s);
      wgmma_wait<1>(); // the scores (committed first) are back; P V may still run
      consumer.release(&sh.k_empty[sn]);
      consumer.softmax_update(t, u);
      wgmma_wait<0>();
      fence_registers(r.sm.o[0]);
      consumer.release(&sh.v_empty[s]);
      if constexpr (!C::kRescaleUnderScores) r.sm.rescale(r.alpha);
      consumer.to_p();
      s = sn;
      phase = pn;
      pv_rows = consumer.v_rows(t);
    }
    if constexpr (C::kRescaleUnderScores) r.sm.rescale(r.alpha);
    barrier_wait(&sh.v_full[s], phase);
    consumer.clean_v(s, pv_rows);
    consumer.issue_pv(s);
    wgmma_wait<0>();
    fence_registers(r.sm.o[0]);
    consumer.release(&sh.v_empty[s]);
  }
  // 4. O / l out, a prior partial of the rows merged in first where the call has one.
  if (a.o_prior.data) r.sm.merge_prior(a, batch, head, op.r_lo + 16 * op.warp_in_wg, rows.m1, lane);
  consumer.store_o(o_map, o_bulk, head, batch);
#endif
}

// O leaves through the copy engine in boxes of one consumer's 64 rows where the copy engine can
// address it (o_store_map: in the output dtype in rows of swizzle_cols(D), or in fp32 in rows of
// f32_cols); else the threads store it and the map stays empty.
inline bool o_bulk_store(const ForwardParams& p) { return tma_readable(p.o, p.o_fp32 ? 4 : 2); }
inline CUtensorMap o_store_map(const ForwardParams& p, bool o_bulk, int f32_cols) {
  CUtensorMap map;
  std::memset(&map, 0, sizeof map);
  const int w = swizzle_cols(p.head_dim);
  if (o_bulk && p.o_fp32)
    map = make_tile_map(p.o, DType::fp32, p.batch, p.seqlen_q, p.heads_q, p.head_dim, 64, f32_cols,
                        tma_swizzle(2 * f32_cols)); // (tma_swizzle counts a row in 16-bit elements)
  else if (o_bulk)
    map = make_tile_map(p.o, output_dtype(p.dtype), p.batch, p.seqlen_q, p.heads_q, p.head_dim, 64, w, tma_swizzle(w));
  return map;
}

template <class T, int D, Tiles kTiles> void launch_forward_config(const ForwardParams& p, cudaStream_t stream) {
  using C = ForwardConfig<T, D, kTiles>;
  const AttnArgs a = forward_args(p);
  const CUtensorMapSwizzle sw = tma_swizzle(C::W);
  const CUtensorMap q_map = make_tile_map(p.q, p.dtype, p.batch, p.seqlen_q, p.heads_q, D, C::kBlockM, C::W, sw);
  const CUtensorMap k_map = make_tile_map(p.k, p.dtype, p.batch, p.seqlen_kv, p.heads_kv, D, C::kBlockN, C::W, sw);
  const CUtensorMap v_map = make_tile_map(p.v, p.dtype, p.batch, p.seqlen_kv, p.heads_kv, D, C::kBlockN, C::W, sw);
  const bool o_bulk = o_bulk_store(p);
  const CUtensorMap o_map = o_store_map(p, o_bulk, C::kF32Cols);
  const auto kernel = flash_forward_sm90_kernel<T, D, kTiles>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes));
  const dim3 grid(unsigned(tile_grid(p.seqlen_q, C::kBlockM, p.num_segments)), unsigned(p.heads_q),
                  unsigned(p.batch));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(q_map, k_map, v_map, o_map, a, o_bulk);
  check_launch("flash forward (sm90)");
}

// The pair configuration serves calls whose query tiles each see few key tiles, where a CTA's
// start and its store of O weigh most: causal calls of at most 1024 rows and keys, 2048 at d64.
// Measured (docs/KERNELS.md, "Two CTAs an SM for short causal rows"): +24% at S=512 causal; on an H200
// +6% at 1024 (d128), +10-13% at 1024 for d64 / d96 and at 768; at 1536 -7% (d128),
// +0-3% (d96), +6% (d64); at 2048 -11% (d128), -5% (d96), +1.6% (d64). Slower for the full mask,
// where one CTA's 128-column tiles win. Segment lengths live on the device, and an
// average would send a documents mix (many short, one long) to the slower tiles: a call with
// segments qualifies by its total length alone.
inline bool pair_serves(const ForwardParams& p) {
  const int64_t rows = p.head_dim == 64 ? 2048 : 1024;
  return p.mask.causal && !p.blocks && p.seqlen_q <= rows && p.seqlen_kv <= rows;
}

// The wide configuration serves long rows of keys, where its fewer rounds of per-tile work beat its
// costlier start and its ragged last tile: measured at d128 (docs/KERNELS.md, "Wide key tiles") +1.8%
// at 8192 keys for the full mask, +3-4% from 16384 for both masks, slower below (-6% at 2048); at
// d96 +3.6% at 8192 full, +3% / +5% at 16384, -4% at 4096 causal.
inline bool wide_serves(const ForwardParams& p) {
  return plain_call(p) && p.seqlen_kv >= (p.mask.causal ? 16384 : 8192);
}

// Three consumers at d64: full mask +4.7% at 2048 keys and +7-8% from 8192, -7% at 1024; causal +4%
// from 8192, -6% at 2048 (docs/KERNELS.md, "Three consumers at d64").
inline bool three_serves(const ForwardParams& p) {
  return plain_call(p) && p.seqlen_kv >= (p.mask.causal ? 8192 : 2048);
}

template <class T, int D> void launch_forward_sm90(const ForwardParams& p, cudaStream_t stream) {
  if constexpr (D == 64) {
    if (three_serves(p)) return launch_forward_config<T, D, Tiles::three>(p, stream);
  }
  if constexpr (D == 96 || D == 128) { // (at d80 a 176-row tile is not a whole number of KiB)
    if (wide_serves(p)) return launch_forward_config<T, D, Tiles::wide>(p, stream);
  }
  if constexpr (D <= 128) { // d256's consumer needs the registers of one CTA an SM
    if (pair_serves(p)) return launch_forward_config<T, D, Tiles::pair>(p, stream);
  }
  launch_forward_config<T, D, Tiles::standard>(p, stream);
}

} // namespace attncore::cuda::sm90
