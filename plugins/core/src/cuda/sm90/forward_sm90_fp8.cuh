// Flash-attention forward on Hopper in FP8 (e4m3 Q, K, V; bf16 or fp32 O): the structure of the
// bf16 kernel (forward_sm90.cuh: a producer thread, consumer warpgroups of 64 rows, two or three at
// d64, rings of K and V tiles, the loop one tile ahead), with what FP8 products need:
//  - k-steps of 32 and both operands K-major. S = Q K^T reads Q and K as they lie; O += P V needs
//    V with its keys contiguous, so a pass before the kernel writes V^T (transpose_v_fp8) and the
//    kernel loads V^T tiles of [head dim rows x kBlockN keys].
//  - P straight from the score registers: an fp32 score fragment holds, for each of the lane's
//    rows, keys 8 j + 2 (lane % 4) + {0, 1} of a 32-key group, where the FP8 A fragment wants
//    keys 4 (lane % 4) + {0..3} and 16 + 4 (lane % 4) + {0..3}. Rather than move bytes between
//    lanes, V^T's keys are stored in the order the registers hold them (v_key_at): position x of a
//    32-key group holds key v_key_at(x), and each lane packs its own scores.
//  - Scaling in the kernel: the scores carry descale_q descale_k (in the softmax's scale), P is
//    rounded to e4m3 in [0, 1], O carries descale_v once at the end.
// The descale of P itself is 1: the row's largest P is 1, which e4m3 holds exactly.
// Calls without segments: a segment's tiles start at its first key, not on a 32-key group of V^T.
#pragma once

#include "forward_sm90.cuh"
#include "fp8_operands.cuh"

namespace attncore::cuda::sm90 {

// Tiles in hopper.cuh's 16-bit vocabulary: a row of n FP8 elements is n / 2 16-bit columns. Two
// consumers, or three at d64 (192-row CTAs, as the bf16 kernel's three_serves), where the softmax
// rather than the products bounds a tile. Key tiles of 128, or 192 (fewer row reductions and
// rescales a key; V^T tiles in three 64-key column blocks).
template <int D_, int kConsumers_, int kBlockN_ = 128> struct Fp8ForwardConfig {
  static constexpr int D = D_;
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kThreads = (kConsumers + 1) * 128;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kConsumers == 3 ? 3 : 2; // (three: the fp32 O stage needs the room)
  static constexpr int W = swizzle_cols(D / 2);        // Q's and K's swizzled rows, in 16-bit columns
  static constexpr int kCols = 2 * W;                  // ... in FP8 elements
  static constexpr int WV = swizzle_cols(kBlockN / 2); // V^T's swizzled rows (of a column block)
  static constexpr int kVtKeys = 2 * WV;               // keys of a V^T column block
  static constexpr int kSTiles = kBlockN / 8;
  static constexpr int kOTiles = D / 8;
  static constexpr int kPSteps = kBlockN / 32;         // k-steps of P V
  static constexpr int kOutW = swizzle_cols(D);        // bf16 O's staged rows
  static constexpr int kF32Cols = 32;                  // fp32 O's (128-byte rows)
  static constexpr uint32_t kQBytes = kBlockM * D;
  static constexpr uint32_t kKVBytes = kBlockN * D;    // one of K or V^T
  // 24 + 2 x 240 = 3 x 168; 24 + 3 x 160 <= 4 x 128
  static constexpr int kProducerRegs = 24, kConsumerRegs = kConsumers == 3 ? 160 : 240;
  // O rescaled right after the next scores are issued (as the bf16 kernel at d64 and d80): at d128
  // with 128-key tiles +3.6% causal / +2.9% full at 16384 rows; with 192-key tiles -0.3% / -1.2%
  // there and -1.4% causal at 4096; at d64 (three consumers) -3% / -4%, at d256 equal
  // (docs/KERNELS.md, "FP8 forward").
  static constexpr bool kRescaleUnderScores = D == 128 && kBlockN == 128;
  // Each row's maximum kept until it grows past 2^8 (OnlineSoftmax::update_lazy), O's rescale
  // skipped meanwhile: with 192-key tiles at d128 -1.4% / -1.7% causal / full at 16384 rows, -1.5% /
  // level at 4096; at d256 -0.5% / -1.5%; slower with three consumers at d64 (+5.5% / +7%) and with
  // d128's 128-key tiles (+0.7% / +1.3% at 1024 rows) (docs/KERNELS.md, "FP8 forward").
  static constexpr bool kLazyRescale = (D == 128 && kBlockN == 192) || D == 256;
  // A tile's softmax first runs against the kept maxima without looking for its own
  // (OnlineSoftmax::update_kept), and only a tile where some P could pass e4m3's 448 takes its
  // scores again and the step with its maxima: d128 -10.5% / -11.7% causal / full at 16384 rows,
  // d64 -13%, d256 -4%, d128's 128-key tiles -3% / -5% at 1024 rows (docs/KERNELS.md, "FP8 forward").
  static constexpr float kKeptLimit = 448.f;
  static constexpr size_t kSmemBytes = 1024 /* alignment */ + kQBytes + 2 * kStages * kKVBytes + 512;
  static_assert(D % 64 == 0, "FP8 head dims are multiples of 64 (k-steps of 32 bytes in whole swizzled rows)");
  static_assert(kBlockN % kVtKeys == 0, "a V^T tile is whole column blocks");
  static_assert(kSmemBytes <= 227 * 1024, "must fit a Hopper SM");
  static_assert(kConsumers * 64 * D * 4 <= kQBytes + 2 * kStages * kKVBytes, "O (fp32 too) is staged over Q, K and V");
};

template <class C> struct Fp8ForwardShared {
  unsigned char* base; // 1024-aligned; O is staged over it
  uint8_t* q;
  uint8_t* k;  // kStages tiles
  uint8_t* vt; // kStages tiles
  uint64_t *q_full, *k_full, *v_full, *k_empty, *v_empty;
  TileStep* steps;
};

template <class C> __device__ __forceinline__ Fp8ForwardShared<C> fp8_forward_shared(unsigned char* smem_raw) {
  unsigned char* smem = align_smem<1024>(smem_raw);
  Fp8ForwardShared<C> sh;
  sh.base = smem;
  sh.q = smem;
  sh.k = smem + C::kQBytes;
  sh.vt = sh.k + C::kStages * C::kKVBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sh.vt + C::kStages * C::kKVBytes);
  sh.q_full = bars;
  sh.k_full = bars + 1;
  sh.v_full = sh.k_full + C::kStages;
  sh.k_empty = sh.v_full + C::kStages;
  sh.v_empty = sh.k_empty + C::kStages;
  sh.steps = reinterpret_cast<TileStep*>(sh.v_empty + C::kStages);
  return sh;
}

// The producer, one thread: Q once, then K and V^T of every tile the rows see.
template <class C>
__device__ __forceinline__ void fp8_produce_tiles(const Fp8ForwardShared<C>& sh, const AttnArgs& a,
                                                  const ForwardRows& rows, const CUtensorMap& q_map,
                                                  const CUtensorMap& k_map, const CUtensorMap& vt_map, int head,
                                                  int kv_head, int batch) {
  constexpr int D = C::D;
  TileWalk<C::kBlockN> walk;
  start_walk(walk, a, rows, head);
  tma_prefetch_map(&q_map);
  tma_prefetch_map(&k_map);
  tma_prefetch_map(&vt_map);
  barrier_expect_bytes(sh.q_full, C::kQBytes);
  for (int cb = 0; cb < D / C::kCols; ++cb)
    tma_load_4d(sh.q + cb * C::kBlockM * C::kCols, &q_map, sh.q_full, cb * C::kCols, rows.m0, head, batch);
  TileStep t;
  for (uint32_t step = 0;; ++step) {
    const uint32_t s = step % C::kStages, phase = (step / C::kStages) & 1;
    const bool more = walk.next(t, a.mask, rows.reg, rows.m0, rows.m1, a.blocks);
    barrier_wait(&sh.k_empty[s], phase ^ 1);
    if (!more) {
      sh.steps[s].c0 = -1;
      barrier_arrive(&sh.k_full[s]);
      break;
    }
    sh.steps[s] = t;
    uint8_t* k_tile = sh.k + s * C::kKVBytes;
    barrier_expect_bytes(&sh.k_full[s], C::kKVBytes);
    for (int cb = 0; cb < D / C::kCols; ++cb)
      tma_load_4d(k_tile + cb * C::kBlockN * C::kCols, &k_map, &sh.k_full[s], cb * C::kCols, t.c0, kv_head, batch);
    barrier_wait(&sh.v_empty[s], phase ^ 1);
    barrier_expect_bytes(&sh.v_full[s], C::kKVBytes);
    for (int cb = 0; cb < C::kBlockN / C::kVtKeys; ++cb)
      tma_load_4d(sh.vt + s * C::kKVBytes + cb * D * C::kVtKeys, &vt_map, &sh.v_full[s], t.c0 + cb * C::kVtKeys, 0,
                  kv_head, batch);
  }
}

// A consumer warpgroup's steps over a key tile.
template <class C> struct Fp8ForwardConsumer {
  static constexpr int D = C::D;
  using T = __nv_fp8_e4m3;
  static constexpr uint32_t kStageStep = desc_offset(C::kKVBytes);

  const Fp8ForwardShared<C>& sh;
  const AttnArgs& a;
  const ForwardRows& rows;
  int wg, warp_in_wg, lane;
  int32_t r_lo, r_hi;
  bool has_rows;
  int list;
  uint64_t q_desc, k_desc, vt_desc;
  float sc[1][C::kSTiles][4];
  OnlineSoftmax<1, C::kOTiles> sm;
  uint32_t p[C::kPSteps][4];
  float alpha[1][2];
  bool rescale_o = true; // (warp-uniform) O must be rescaled by alpha after this tile's update

  __device__ __forceinline__ Fp8ForwardConsumer(const Fp8ForwardShared<C>& sh_, const AttnArgs& a_,
                                                const ForwardRows& rows_, int warp, int group, int lane_)
      : sh(sh_), a(a_), rows(rows_), wg(group - 1), warp_in_wg(warp % 4), lane(lane_) {
    r_lo = rows.m0 + 64 * wg;
    r_hi = min(r_lo + 64, rows.m1);
    has_rows = r_hi > r_lo;
    list = rows.blocks && r_lo / a.blocks.block_q != rows.qb0 ? 1 : 0;
    q_desc = desc_k_major<C::W>(sh.q, C::kBlockM, 64 * wg);
    k_desc = desc_k_major<C::W>(sh.k, C::kBlockN, 0);
    vt_desc = desc_k_major<C::WV>(sh.vt, D, 0);
  }

  __device__ __forceinline__ bool next_tile(uint32_t step, TileStep& t) {
    barrier_wait(&sh.k_full[step % C::kStages], (step / C::kStages) & 1);
    t = sh.steps[step % C::kStages];
    return warp_uniform(t.c0 >= 0);
  }

  __device__ __forceinline__ TileUse use_of(const TileStep& t) {
    return tile_use<C::kBlockN>(t, a, rows, r_lo, r_hi, has_rows, list);
  }

  // S = Q K^T, issued: k-steps of 32 elements (16 16-bit columns).
  __device__ __forceinline__ void issue_scores(uint32_t s) {
    const uint64_t k_stage = k_desc + s * kStageStep;
    wgmma_fence();
#pragma unroll
    for (int k0 = 0; k0 < D / 2; k0 += 16)
      Wgmma<T, C::kBlockN>::template ss<0, 0>(sc[0], q_desc + k_major_step<C::W>(C::kBlockM, k0),
                                              k_stage + k_major_step<C::W>(C::kBlockN, k0), k0 > 0);
    wgmma_commit();
  }

  // O += P V^T's keys, issued.
  __device__ __forceinline__ void issue_pv(uint32_t s) {
    const uint64_t v_stage = vt_desc + s * kStageStep;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kPSteps; ++kk)
      Wgmma<T, D>::template rs<0>(sm.o[0], p[kk], v_stage + k_major_step<C::WV>(D, 16 * kk), true);
    wgmma_commit();
  }

  __device__ __forceinline__ void mask_scores(const TileStep& t, const TileUse& u) {
    fence_registers(sc[0]);
    if (u.needs_mask) mask_tile(sc, a.mask, rows.reg, r_lo + 16 * warp_in_wg, t.c0, u.listed, u.masked, lane);
  }

  // The step with the tile's maxima.
  __device__ __forceinline__ void softmax_update(const TileStep& t, const TileUse& u) {
    mask_scores(t, u);
    if constexpr (C::kLazyRescale) {
      rescale_o = sm.template update_lazy<8>(sc, a.scale_log2, alpha);
    } else {
      sm.update(sc, a.scale_log2, alpha);
      rescale_o = true;
    }
  }

  // The step against the kept maxima, decided for the warpgroup as one, as its scores are taken
  // again where it fails (a warpgroup's product): true if every lane's P fit, l then taking their sums.
  // (Barrier 5 + wg: with three consumers the O store's 3 + wg reaches 5 too, but only after barrier
  // 2, which every consumer meets once out of its loop.)
  __device__ __forceinline__ bool softmax_kept(const TileStep& t, const TileUse& u) {
    mask_scores(t, u);
    float sum[1][2];
    const bool fits = sm.update_kept(sc, a.scale_log2, C::kKeptLimit, sum);
    if (!warp_uniform(named_barrier_all(5 + wg, 128, fits))) return false;
    sm.add_sums(sum);
    rescale_o = false;
    return true;
  }

  // P in e4m3, each 32-key group's A fragment from its four n8 score tiles (v_key_at): P against the
  // row's kept maximum (at most 448, softmax_kept's check, or 2^8 after update_lazy), its descale 1.
  __device__ __forceinline__ void to_p() { pack_e4m3_fragments(p, sc[0]); }

  __device__ __forceinline__ void release(uint64_t* empty) {
    __syncwarp();
    if (lane == 0) barrier_arrive(empty);
  }

  // O times descale_v, / l, out: staged over Q, K and V^T once both consumers are done with them
  // (bf16 rows take twice Q's bytes), then one bulk store per column block; else by the threads.
  __device__ __forceinline__ void store_o(const CUtensorMap& o_map, bool o_bulk, float descale_v, int head,
                                          int batch) {
#pragma unroll
    for (int j = 0; j < C::kOTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sm.o[0][j][e] *= descale_v;
    const int32_t row0 = r_lo + 16 * warp_in_wg;
    if (a.o_prior.data) sm.merge_prior(a, batch, head, row0, rows.m1, lane); // in O's units, after the descale
    if (o_bulk) named_barrier_sync(2, C::kConsumers * 128);
    if (o_bulk && has_rows && warp_uniform(r_lo + 64 <= rows.reg.row_end || rows.reg.row_end == a.seqlen_q)) {
      const int cols = a.o_fp32 ? C::kF32Cols : C::kOutW;
      const uint32_t block_bytes = 64 * cols * (a.o_fp32 ? 4 : 2);
      const unsigned char* stage = sh.base + wg * 64 * D * (a.o_fp32 ? 4 : 2);
      if (a.o_fp32)
        stage_o<float, C::kF32Cols>(sm, a, batch, head, r_lo, row0, rows.m1, lane, smem_addr(stage), block_bytes);
      else
        stage_o<__nv_bfloat16, C::kOutW>(sm, a, batch, head, r_lo, row0, rows.m1, lane, smem_addr(stage), block_bytes);
      fence_async_shared();
      named_barrier_sync(3 + wg, 128);
      if (warp_in_wg == 0 && lane == 0) {
        for (int cb = 0; cb < D / cols; ++cb) tma_store_4d(&o_map, stage + cb * block_bytes, cb * cols, r_lo, head, batch);
        bulk_commit();
        bulk_wait_read();
      }
    } else {
      sm.template store<__nv_bfloat16>(a, batch, head, row0, rows.m1, lane);
    }
  }
};

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1)
    flash_forward_sm90_fp8_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                  const __grid_constant__ CUtensorMap vt_map, const __grid_constant__ CUtensorMap o_map,
                                  const __grid_constant__ AttnArgs a, float descale_v, bool o_bulk) {
#if ATTNCORE_SM90_DEVICE
  // 1. Shared memory, this thread's role, the CTA's rows, the barriers.
  extern __shared__ unsigned char smem_raw[];
  const Fp8ForwardShared<C> sh = fp8_forward_shared<C>(smem_raw);
  const int tid = threadIdx.x, warp = warp_uniform(int(tid / 32)), lane = tid % 32, group = warp / 4;
  const int head = blockIdx.y, batch = blockIdx.z, kv_head = head / a.group;
  ForwardRows rows;
  if (!locate_rows<C>(a, rows)) return;
  if (tid == 0) init_barriers<C::kStages, C::kConsumers>(sh);
  __syncthreads();

  // 2. The producer: Q, then K and V^T of every tile the walk yields.
  if (group == 0) {
    regs_dealloc<C::kProducerRegs>();
    if (warp == 0 && lane == 0) fp8_produce_tiles(sh, a, rows, q_map, k_map, vt_map, head, kv_head, batch);
    return;
  }

  // 3. The consumers: S = Q K^T, the softmax, P in e4m3, O += P V, one tile ahead.
  regs_alloc<C::kConsumerRegs>();
  Fp8ForwardConsumer<C> c(sh, a, rows, warp, group, lane);
  c.sm.init();
  barrier_wait(sh.q_full, 0);
  TileStep t;
  if (c.next_tile(0, t)) {
    c.issue_scores(0);
    wgmma_wait<0>();
    c.release(&sh.k_empty[0]);
    c.softmax_update(t, c.use_of(t));
    c.to_p();
    uint32_t s = 0, phase = 0;
    for (uint32_t step = 1; c.next_tile(step, t); ++step) {
      const uint32_t sn = step % C::kStages, pn = (step / C::kStages) & 1;
      const auto u = c.use_of(t);
      c.issue_scores(sn);
      if constexpr (C::kRescaleUnderScores) if (c.rescale_o) c.sm.rescale(c.alpha);
      barrier_wait(&sh.v_full[s], phase);
      c.issue_pv(s);
      wgmma_wait<1>();
      // A tile whose P could pass 448 against the kept maxima takes its scores again (its K stage is
      // released after) and the step with its own maxima.
      if (!c.softmax_kept(t, u)) {
        c.issue_scores(sn);
        wgmma_wait<0>();
        c.softmax_update(t, u);
      }
      c.release(&sh.k_empty[sn]);
      wgmma_wait<0>();
      fence_registers(c.sm.o[0]);
      c.release(&sh.v_empty[s]);
      if constexpr (!C::kRescaleUnderScores) if (c.rescale_o) c.sm.rescale(c.alpha);
      c.to_p();
      s = sn;
      phase = pn;
    }
    if constexpr (C::kRescaleUnderScores) if (c.rescale_o) c.sm.rescale(c.alpha);
    barrier_wait(&sh.v_full[s], phase);
    c.issue_pv(s);
    wgmma_wait<0>();
    fence_registers(c.sm.o[0]);
    c.release(&sh.v_empty[s]);
  }
  // 4. O out.
  c.store_o(o_map, o_bulk, descale_v, head, batch);
#endif
}

template <class C> void launch_fp8_config(const ForwardParams& p, cudaStream_t stream) {
  constexpr int D = C::D;
  // 1. V^T, keys in the order the score registers hold them.
  const Fp8Transposed vt = transpose_fp8<D>(p.v, static_cast<uint8_t*>(p.workspace), p.seqlen_kv, p.heads_kv,
                                            p.batch, stream, "V^T (FP8 forward)");

  // 2. The attention kernel over Q, K and V^T.
  AttnArgs a = forward_args(p);
  a.scale_log2 *= p.descale_q * p.descale_k; // scores in units of the accumulator
  a.scale *= p.descale_q * p.descale_k;
  const CUtensorMapSwizzle sw = tma_swizzle(C::W);
  const CUtensorMap q_map = make_tile_map(p.q, p.dtype, p.batch, p.seqlen_q, p.heads_q, D, C::kBlockM, C::kCols, sw);
  const CUtensorMap k_map = make_tile_map(p.k, p.dtype, p.batch, p.seqlen_kv, p.heads_kv, D, C::kBlockN, C::kCols, sw);
  // V^T as a [batch, head dim, kv head, key] tensor: boxes of every dim row x a column block's keys.
  const CUtensorMap vt_map = make_tile_map(vt.ref, p.dtype, p.batch, D, p.heads_kv, int32_t(vt.tokens), D,
                                           C::kVtKeys, tma_swizzle(C::WV));
  const bool o_bulk = o_bulk_store(p);
  const CUtensorMap o_map = o_store_map(p, o_bulk, C::kF32Cols);
  const auto kernel = flash_forward_sm90_fp8_kernel<C>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes));
  const dim3 grid(unsigned(tile_grid(p.seqlen_q, C::kBlockM, 0)), unsigned(p.heads_q), unsigned(p.batch));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(q_map, k_map, vt_map, o_map, a, p.descale_v, o_bulk);
  check_launch("flash forward (sm90, FP8)");
}

template <int D> void launch_forward_sm90_fp8(const ForwardParams& p, cudaStream_t stream) {
  if (p.num_segments > 0) throw Error("attncore: the FP8 forward on CUDA takes calls without segments");
  if (!p.workspace || p.workspace_bytes < forward_workspace_bytes(p))
    throw Error("attncore: an FP8 forward on CUDA needs forward_workspace_bytes(params) of workspace (V^T)");
  // Three consumers at d64 for calls whose rows see one run of keys (a CTA's 192 rows span three
  // 64-row query blocks, more than a TileStep lists): +22% causal / +27% full at 16384 rows.
  if constexpr (D == 64) {
    if (plain_call(p)) return launch_fp8_config<Fp8ForwardConfig<D, 3>>(p, stream);
  }
  // 192-key tiles at d128 for plain calls of 2048 keys and more: -5.5% / -6.0% causal / full at
  // 16384 keys, -2.5% at 4096, -1% full and level causal at 2048, +3-7% at 1024 (docs/KERNELS.md,
  // "FP8 forward").
  if constexpr (D == 128) {
    if (plain_call(p) && p.seqlen_kv >= 2048) return launch_fp8_config<Fp8ForwardConfig<D, 2, 192>>(p, stream);
  }
  launch_fp8_config<Fp8ForwardConfig<D, 2>>(p, stream);
}

} // namespace attncore::cuda::sm90
