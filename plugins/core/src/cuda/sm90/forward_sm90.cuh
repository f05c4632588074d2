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

// Key tiles of kN (64, 128; 176: below) columns, built from the 64-column walk of the mma.sync kernels
// (tiles.cuh): a 128-column tile may hold two 64-column blocks of a block list, of which one or
// both are listed for a query block.
// Tiles that are not whole 64-column blocks (the wide configuration's) are walked directly, at their
// own width, over the interval the mask allows (no block lists).
template <int kN> struct TileWalk {
  static constexpr bool kDirect = kN % 64 != 0;
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

template <class T, int D, Tiles kTiles>
__global__ void __launch_bounds__(ForwardConfig<T, D, kTiles>::kThreads, ForwardConfig<T, D, kTiles>::kCtasPerSm)
    flash_forward_sm90_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                              const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                              const __grid_constant__ AttnArgs a, bool o_bulk) {
#if ATTNCORE_SM90_DEVICE
  using C = ForwardConfig<T, D, kTiles>;
  constexpr int W = C::W;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_smem<1024>(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = reinterpret_cast<T*>(smem + C::kQBytes);                            // kStages tiles
  T* sV = reinterpret_cast<T*>(smem + C::kQBytes + C::kStages * C::kKVBytes); // kStages tiles
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + C::kF32Stage + C::kF32StageBytes);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = k_full + C::kStages;
  uint64_t* k_empty = v_full + C::kStages;
  uint64_t* v_empty = k_empty + C::kStages;
  TileStep* steps = reinterpret_cast<TileStep*>(v_empty + C::kStages); // the tile in each K buffer

  const int tid = threadIdx.x, warp = warp_uniform(int(tid / 32)), lane = tid % 32, group = warp / 4;
  const int head = blockIdx.y, batch = blockIdx.z, kv_head = head / a.group;
  const int32_t x = int32_t(gridDim.x - 1 - blockIdx.x); // last tiles first: causal ones are heaviest

  Region reg;
  int32_t m0;
  if (a.nseg > 0) {
    int32_t seg, tile;
    if (!locate_tile(a.segs, a.nseg, x, C::kBlockM, true, seg, tile)) return;
    reg = segment_region(a.segs[seg]);
    m0 = reg.row_begin + tile * C::kBlockM;
  } else {
    reg = whole_call(a.mask, a.seqlen_q, a.seqlen_kv);
    m0 = x * C::kBlockM;
  }
  const int32_t m1 = min(m0 + C::kBlockM, reg.row_end);
  const bool blocks = a.blocks.heads > 0;
  const int32_t qb0 = blocks ? m0 / a.blocks.block_q : 0;

  if (tid == 0) {
    barrier_init(q_full, 1);
    for (int s = 0; s < C::kStages; ++s) {
      barrier_init(&k_full[s], 1);
      barrier_init(&v_full[s], 1);
      barrier_init(&k_empty[s], C::kConsumers * 4); // one arrival per consumer warp
      barrier_init(&v_empty[s], C::kConsumers * 4);
    }
    barrier_init_fence();
  }
  __syncthreads();

  if (group == 0) { // producer: the only walker; each tile's TileStep rides with its K buffer
    regs_dealloc<C::kProducerRegs>();
    if (warp == 0 && lane == 0) {
      TileWalk<C::kBlockN> walk;
      if (blocks) {
        const int32_t row = (a.blocks.heads == 1 ? 0 : head) * a.blocks.num_q_blocks;
        walk.inner.init_blocks(a.blocks, row + qb0, row + (m1 - 1) / a.blocks.block_q);
      } else {
        walk.inner.init_interval(a.mask, reg, m0, m1);
      }
      tma_prefetch_map(&q_map);
      tma_prefetch_map(&k_map);
      tma_prefetch_map(&v_map);
      barrier_expect_bytes(q_full, C::kQBytes);
      for (int cb = 0; cb < D / W; ++cb) tma_load_4d(sQ + cb * C::kBlockM * W, &q_map, q_full, cb * W, m0, head, batch);
      TileStep t;
      for (uint32_t step = 0;; ++step) {
        const uint32_t s = step % C::kStages, phase = (step / C::kStages) & 1;
        const bool more = walk.next(t, a.mask, reg, m0, m1, a.blocks);
        barrier_wait(&k_empty[s], phase ^ 1);
        if (!more) { // the end: a step with no tile
          steps[s].c0 = -1;
          barrier_arrive(&k_full[s]);
          break;
        }
        steps[s] = t; // published by the arrive below (release), read after the consumers' wait
        T* k_tile = sK + s * (C::kKVBytes / sizeof(T));
        T* v_tile = sV + s * (C::kKVBytes / sizeof(T));
        barrier_expect_bytes(&k_full[s], C::kKVBytes);
        for (int cb = 0; cb < D / W; ++cb)
          tma_load_4d(k_tile + cb * C::kBlockN * W, &k_map, &k_full[s], cb * W, t.c0, kv_head, batch);
        barrier_wait(&v_empty[s], phase ^ 1);
        barrier_expect_bytes(&v_full[s], C::kKVBytes);
        for (int cb = 0; cb < D / W; ++cb)
          tma_load_4d(v_tile + cb * C::kBlockN * W, &v_map, &v_full[s], cb * W, t.c0, kv_head, batch);
      }
    }
    return;
  }

  // consumers
  regs_alloc<C::kConsumerRegs>();
  const int wg = group - 1, warp_in_wg = warp % 4;
  const int32_t r_lo = m0 + 64 * wg, r_hi = min(r_lo + 64, m1); // this warpgroup's rows
  const bool has_rows = r_hi > r_lo;
  const int list = blocks && r_lo / a.blocks.block_q != qb0 ? 1 : 0; // (selects below, not list[...])

  // The tile of step `step`, once its K is in: false at the end.
  const auto next_tile = [&](uint32_t step, TileStep& t) {
    barrier_wait(&k_full[step % C::kStages], (step / C::kStages) & 1);
    t = steps[step % C::kStages];
    return warp_uniform(t.c0 >= 0);
  };

  // Which of a tile's pairs this warpgroup must hide: the halves a block list does not list for
  // its query block, the halves that need element masking, the columns past the region.
  constexpr uint32_t kAll = (1u << ((C::kBlockN + 63) / 64)) - 1; // every 64-column part of a tile
  struct Use {
    bool needs_mask; // (warp-uniform: it decides a branch between the products)
    uint32_t listed, masked;
  };
  const auto use_of = [&](const TileStep& t) {
    Use u;
    if (blocks) {
      u.listed = list ? t.listed[1] : t.listed[0];
      u.masked = list ? t.masked[1] : t.masked[0];
    } else {
      u.listed = kAll;
      u.masked = has_rows && all_visible(a.mask, reg.row_pos(r_lo), reg.row_pos(r_hi - 1), reg.col_pos(t.c0),
                                         reg.col_pos(t.c0 + C::kBlockN - 1)) ? 0u : kAll;
    }
    u.needs_mask = warp_uniform(u.listed != kAll || u.masked != 0 || t.cross);
    return u;
  };

  // Shared-memory descriptors, made once: a k-step or a stage only adds a constant.
  const uint64_t q_desc = desc_k_major<W>(sQ, C::kBlockM, 64 * wg);
  const uint64_t k_desc = desc_k_major<W>(sK, C::kBlockN, 0);
  const uint64_t v_desc = desc_mn_major<W>(sV, C::kBlockN);
  constexpr uint32_t kStageStep = desc_offset(C::kKVBytes);

  // S = Q K^T, issued (its registers are the hardware's until the caller waits).
  float sc[1][C::kSTiles][4];
  const auto issue_scores = [&](uint32_t s) {
    const uint64_t k_stage = k_desc + s * kStageStep;
    wgmma_fence();
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16)
      Wgmma<T, C::kBlockN>::template ss<0, 0>(sc[0], q_desc + k_major_step<W>(C::kBlockM, k0),
                                              k_stage + k_major_step<W>(C::kBlockN, k0), k0 > 0);
    wgmma_commit();
  };
  // O += P V, issued.
  OnlineSoftmax<1, C::kOTiles> sm;
  uint32_t p[C::kBlockN / 16][4]; // P as A fragments of the second product
  const auto issue_pv = [&](uint32_t s) {
    const uint64_t v_stage = v_desc + s * kStageStep;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk)
      Wgmma<T, D>::template rs<1>(sm.o[0], p[kk], v_stage + mn_major_step<W>(16 * kk), true);
    wgmma_commit();
  };
  // The scores back: mask, the softmax update (O untouched), alpha for O.
  float alpha[1][2];
  const auto softmax_update = [&](const TileStep& t, const Use& u) {
    fence_registers(sc[0]);
    if (u.needs_mask) mask_tile(sc, a.mask, reg, r_lo + 16 * warp_in_wg, t.c0, u.listed, u.masked, lane);
    sm.update(sc, a.scale_log2, alpha);
  };
  const auto to_p = [&] {
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk) c_to_a<T>(p[kk], sc[0][2 * kk], sc[0][2 * kk + 1]);
  };
  // Rows of V past a segment's end are zeroed before P V reads them (zero_rows_past): K's are
  // harmless (their scores are masked by a select), V's would reach O as 0 x V. Rare: one tile a
  // segment end; both consumers zero and meet at named barrier 1.
  const auto v_rows = [&](const TileStep& t) {
    return warp_uniform(t.c0 + C::kBlockN > reg.col_end && reg.col_end < a.seqlen_kv ? int(reg.col_end - t.c0)
                                                                                       : C::kBlockN);
  };
  const auto clean_v = [&](uint32_t s, int rows) {
    if (rows < C::kBlockN) {
      zero_rows_past<W, D, C::kBlockN>(sV + s * (C::kKVBytes / sizeof(T)), rows, tid - 128, C::kConsumers * 128);
      named_barrier_sync(1, C::kConsumers * 128);
    }
  };
  const auto release = [&](uint64_t* empty) {
    __syncwarp();
    if (lane == 0) barrier_arrive(empty);
  };

  // Both warpgroups compute every tile the walk yields (at least one of them sees part of it; the
  // mask hides the rest): a product skipped on a run-time condition makes ptxas wait after every
  // product (C7515). The loop runs one tile ahead inside the warpgroup: the scores of tile n are
  // exponentiated while the tensor cores still add P V of tile n - 1 into O.
  sm.init();
  barrier_wait(q_full, 0);
  TileStep t;
  if (next_tile(0, t)) {
    issue_scores(0);
    wgmma_wait<0>();
    release(&k_empty[0]);
    softmax_update(t, use_of(t)); // O is still 0: no rescale
    to_p();
    uint32_t s = 0, phase = 0; // the stage of the tile whose P V is next
    int pv_rows = v_rows(t);
    for (uint32_t step = 1; next_tile(step, t); ++step) {
      const uint32_t sn = step % C::kStages, pn = (step / C::kStages) & 1;
      const Use u = use_of(t);
      issue_scores(sn);
      if constexpr (C::kRescaleUnderScores) sm.rescale(alpha);
      barrier_wait(&v_full[s], phase);
      clean_v(s, pv_rows);
      issue_pv(s);
      wgmma_wait<1>(); // the scores (committed first) are back; P V may still run
      release(&k_empty[sn]);
      softmax_update(t, u);
      wgmma_wait<0>();
      fence_registers(sm.o[0]);
      release(&v_empty[s]);
      if constexpr (!C::kRescaleUnderScores) sm.rescale(alpha);
      to_p();
      s = sn;
      phase = pn;
      pv_rows = v_rows(t);
    }
    if constexpr (C::kRescaleUnderScores) sm.rescale(alpha);
    barrier_wait(&v_full[s], phase);
    clean_v(s, pv_rows);
    issue_pv(s);
    wgmma_wait<0>();
    fence_registers(sm.o[0]);
    release(&v_empty[s]);
  }
  // O leaves through the copy engine where it can (o_bulk): staged in shared memory as a load lays
  // a tile, then one bulk store per column block, not 32 scattered stores a thread.
  //  - In dtype: in this warpgroup's rows of Q's buffer, which its last product has read.
  //  - In fp32 (partials): twice the bytes, in a buffer of its own (kOwnF32Stage); else over Q's and
  //    the K/V buffers, once both consumers are done with them (and so the producer is too: every
  //    copy it issued has been waited for).
  // Only blocks of 64 whole rows, or blocks that end at the tensor's end (the copy engine drops
  // rows past it): rows past a segment's end belong to another segment.
  const int32_t row0 = r_lo + 16 * warp_in_wg;
  if (o_bulk && a.o_fp32 && !C::kOwnF32Stage) named_barrier_sync(2, C::kConsumers * 128);
  if (o_bulk && has_rows && warp_uniform(r_lo + 64 <= reg.row_end || reg.row_end == a.seqlen_q)) {
    const unsigned char* stage;
    uint32_t block_bytes;
    if (a.o_fp32) {
      stage = smem + (C::kOwnF32Stage ? C::kF32Stage : 0) + wg * 64 * D * 4;
      block_bytes = 64 * C::kF32Cols * 4;
      stage_o<float, C::kF32Cols>(sm, a, batch, head, r_lo, row0, m1, lane, smem_addr(stage), block_bytes);
    } else {
      stage = smem + 64 * wg * W * sizeof(T);
      block_bytes = C::kBlockM * W * sizeof(T);
      stage_o<T, W>(sm, a, batch, head, r_lo, row0, m1, lane, smem_addr(stage), block_bytes);
    }
    fence_async_shared();
    named_barrier_sync(3 + wg, 128);
    if (warp_in_wg == 0 && lane == 0) {
      const int cols = a.o_fp32 ? C::kF32Cols : W;
      for (int cb = 0; cb < D / cols; ++cb) tma_store_4d(&o_map, stage + cb * block_bytes, cb * cols, r_lo, head, batch);
      bulk_commit();
      bulk_wait_read(); // the CTA's shared memory must outlive the copy's reads
    }
  } else {
    sm.template store<T>(a, batch, head, row0, m1, lane);
  }
#endif
}

template <class T, int D, Tiles kTiles> void launch_forward_config(const ForwardParams& p, cudaStream_t stream) {
  using C = ForwardConfig<T, D, kTiles>;
  const AttnArgs a = forward_args(p);
  const CUtensorMapSwizzle sw = tma_swizzle(C::W);
  const CUtensorMap q_map = make_tile_map(p.q, p.dtype, p.batch, p.seqlen_q, p.heads_q, D, C::kBlockM, C::W, sw);
  const CUtensorMap k_map = make_tile_map(p.k, p.dtype, p.batch, p.seqlen_kv, p.heads_kv, D, C::kBlockN, C::W, sw);
  const CUtensorMap v_map = make_tile_map(p.v, p.dtype, p.batch, p.seqlen_kv, p.heads_kv, D, C::kBlockN, C::W, sw);
  // O leaves through the copy engine in boxes of one consumer's 64 rows where the copy engine can
  // address it; else the threads store it.
  const bool o_bulk = tma_readable(p.o, p.o_fp32 ? 4 : 2);
  CUtensorMap o_map;
  std::memset(&o_map, 0, sizeof o_map);
  if (o_bulk && p.o_fp32)
    o_map = make_tile_map(p.o, DType::fp32, p.batch, p.seqlen_q, p.heads_q, D, 64, C::kF32Cols,
                          tma_swizzle(2 * C::kF32Cols)); // (tma_swizzle counts a row in 16-bit elements)
  else if (o_bulk)
    o_map = make_tile_map(p.o, p.dtype, p.batch, p.seqlen_q, p.heads_q, D, 64, C::W, sw);
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

// Calls whose rows all see one run of keys: no block list, no segments (their lengths live on the
// device, as for the pair), no window (not measured with the configurations below).
inline bool plain_call(const ForwardParams& p) {
  return !p.blocks && p.num_segments == 0 && p.mask.window_left < 0 && p.mask.window_right < 0;
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
