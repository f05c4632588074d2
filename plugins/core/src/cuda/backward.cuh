// Flash-attention backward (FlashAttention-2's algorithm) on mma.sync m16n8k16, from the final O's
// LSE and delta = rowsum(dO * O):
//     P = exp(scale q.k - LSE),  dP = dO V^T,  dS = P (dP - delta),
//     dV += P^T dO,  dK += scale dS^T Q,  dQ += scale dS K.
//
// dK/dV kernel: a CTA of 8 warps owns 128 keys (64: BackwardConfig) of one (batch, kv head) and
// walks every (query head of the GQA group, query tile of 64 rows, 128 at D = 64) that sees them
// (QWalk), so dK and dV are summed in registers and added once. Warp (r, h) computes S^T and dP^T
// for the r-th quarter of the keys (32 of 128: two m16 tiles, so every Q/dO fragment loaded feeds
// two products) and the h-th half of the step's queries. P^T and dS^T go through shared memory to
// become the A operands of dV and dK, which the warps tile their own way (BackwardConfig::
// kColSplit). With accumulate_dq it also adds dQ = scale dS K into the fp32 accumulator (the
// default path): on sm_90a through the copy engine (a warp's dQ in a box of shared memory, one bulk
// reduce a step; D = 64-128), else atomically. Deterministic mode leaves dQ to the dQ kernel below,
// which recomputes S and dP per query tile and owns its rows: two more products, no atomics.
#pragma once

#include <cuda.h>

#include <cstring>

#include "args.h"
#include "backward_steps.cuh"
#include "device.cuh"
#include "launch.h"
#include "tiles.cuh"
#if ATTNCORE_HAVE_SM90
#include "sm90/hopper.cuh"
#include "sm90/tensor_map.h"
#endif

namespace attncore::cuda {

// dK and dV of the key tile [n0, n0 + kBlockN) of `reg` (one kv head), over every query tile that
// sees it. `stages`: 2 overlaps the next step's loads with this step's products.
// dq_map: where given (sm_90a, BackwardConfig::kDqBoxes), dQ goes to the copy engine through it.
template <class T, int D, int kMTiles, int kBlockM>
__device__ void dkdv_tile(const AttnArgs& a, unsigned char* smem, int stages, const Region& reg, int32_t n0,
                          int kv_head, int batch, const CUtensorMap* dq_map) {
  using C = BackwardConfig<T, D, kMTiles, kBlockM>;
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = reinterpret_cast<T*>(smem + C::kV);
  T* sP = reinterpret_cast<T*>(smem + C::kP); // P^T  [kBlockN] rows of PTile
  T* sdS = reinterpret_cast<T*>(smem + C::kDs); // dS^T
  unsigned char* stage0 = smem + C::kStage0;    // [stages] of Q, dO [kBlockM] rows of Tile, LSE, delta [kBlockM]
  constexpr bool kDqBoxCode = dq_box_code<C>();

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wr = warp & 3, wh = warp >> 2; // S^T and dP^T: key slice, query half
  const int wrow0 = wr * C::kWarpN;        // this warp's first key in the tile
  int grow0, qrow0, col0, dq_col0; // dV, dK: keys grow0.., columns col0..; dQ: rows qrow0.., columns dq_col0..
  grad_slices<C>(warp, grow0, qrow0, col0, dq_col0);
  // This lane's fragment addresses (lane_fragments), made once; a stage adds st x kStageBytes.
  uint32_t k_rows, q_cols, p_rows, do_cols, ds_rows, k_cols;
  lane_fragments<C>(smem, lane, wh, wrow0, grow0, qrow0, col0, dq_col0, k_rows, q_cols, p_rows, do_cols, ds_rows,
                    k_cols);

  // 1. K and V of the tile, and the walk over the query tiles that see it.
  load_kv_tile<T, C>(a, sK, sV, reg, n0, kv_head, batch, tid);
  // dQ's box, made after the loads are issued: made before them, with the warp's other addresses,
  // the kernels spilled more on sm_90a (D = 64: 12 + 12 bytes stored + loaded against 8 + 8;
  // D = 128: 80 + 44 against 24 + 12).
  unsigned char* const dq_box = align_smem<1024>(smem + C::kDqBox0) + warp * C::kDqBoxBytes;
  QWalk<C::kBlockM, C::kBlockN> walk;
  walk.init(a.mask, reg, a.blocks, kv_head * a.group, a.group, n0);
  // With a block list of 64-key blocks, the two halves of a 128-key tile follow their own columns.
  const int list = a.blocks.heads > 0 && (n0 + wrow0) / a.blocks.block_kv != n0 / a.blocks.block_kv ? 1 : 0;

  float dk[C::kGradMTiles][C::kOutTiles][4], dv[C::kGradMTiles][C::kOutTiles][4];
  clear_grads<C>(dk, dv);

  QStep cur;
  bool have = walk.next(cur, a.mask, reg, a.blocks, n0);
  if (have) load_step<T, C>(a, stage0, reg, batch, tid, 0, cur);
  cp_async_commit();
  int st = 0;
  while (have) {
    QStep nxt;
    const bool have_next = walk.next(nxt, a.mask, reg, a.blocks, n0);
    open_step<kDqBoxCode>(dq_map); // one barrier: open_step says why
    const uint32_t stage = st * C::kStageBytes;
    // This lane's query columns' LSE and delta in the stage, read by column_stats just before their use.
    const float* stats = reinterpret_cast<const float*>(stage0 + stage + C::kLse) + C::kWarpM * wh + (lane & 3) * 2;
    const bool active = list ? cur.active[1] : cur.active[0], masked = list ? cur.masked[1] : cur.masked[0];

    // 2. S^T = K Q^T for this warp's keys and queries kWarpM wh... A warp whose keys this step does
    //    not visit (a block list's unlisted half of the tile) computes its products all the same and
    //    masks every pair in step 3: skipped on a branch, the products' registers were carried from
    //    step to step, which cost every step 48 moves and clears (ncu).
    const int32_t base = reg.diff(cur.r0, n0); // (row r0 + m, key n0 + n) has diff base + n - m
    const bool check = !active || masked || n0 + C::kBlockN > reg.col_end;
    float p[C::kMTiles][C::kQTiles][4];
    transposed_product<T, C, D>(p, k_rows, q_cols + stage, NoOp{});
    // The next step's copies, their address arithmetic under S^T's products rather than between
    // the barrier and them (+0.4-1.5%, level at D = 96; after dP^T's, D = 128 lost 7%).
    if (stages == 2) load_next_step<T, C>(a, stage0, reg, batch, tid, st ^ 1, have_next, nxt);
    // 3. P^T = exp(S^T - LSE), masked (all zero for a warp whose keys this step does not visit), into
    //    shared memory, and 4. dP^T = V dO^T, the first under the second where it can be.
    float dp[C::kMTiles][C::kQTiles][4];
    probabilities_and_dp<T, C, D>(a, reg, n0, sP, lane, wh, wrow0, k_rows, q_cols, stage, stats, active, masked, base,
                                  check, p, dp);
    // 5. dS^T = P^T (dP^T - delta) into shared memory.
    store_ds<T, C, C::kScaleInDs>(a, sdS, p, dp, stats, wrow0, lane, wh);
    __syncthreads();

    // 6. dV += P^T dO, dK += dS^T Q on this warp's keys and columns (rows of P^T and dS^T that this
    //    step does not visit are zero), and 7. dQ += scale dS K, in the order grads_and_dq says.
    grads_and_dq<T, D, kMTiles, kBlockM, C, kDqBoxCode>(a, reg, cur, batch, lane, qrow0, dq_col0, p_rows, do_cols,
                                                         ds_rows, k_cols, stage, dq_box, dq_map, dk, dv);
    if (stages == 1) {
      __syncthreads(); // the only stage is free again
      load_next_step<T, C>(a, stage0, reg, batch, tid, 0, have_next, nxt);
    }
    cur = nxt;
    have = have_next;
    st ^= stages - 1;
  }
  cp_async_wait<0>();
  wait_dq_box_read<kDqBoxCode>(dq_map); // the box is read before the CTA goes

  // 8. dK and dV out.
  write_dkdv<T, C, C::kScaleInDs>(a, reg, n0, kv_head, batch, lane, grow0, col0, dk, dv);
}

template <class T, int D, int kMTiles, int kBlockM>
__global__ void __launch_bounds__(BackwardConfig<T, D, kMTiles, kBlockM>::kThreads, 1)
    flash_backward_dkdv_kernel(const __grid_constant__ AttnArgs a, int stages, const __grid_constant__ CUtensorMap dq_map,
                               bool dq_boxes) {
  using C = BackwardConfig<T, D, kMTiles, kBlockM>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = align_smem(smem_raw);
  const int kv_head = blockIdx.y, batch = blockIdx.z;
  if (a.nseg == 0) {
    const int32_t n0 = int32_t(blockIdx.x) * C::kBlockN;
    if (n0 < a.seqlen_kv)
      dkdv_tile<T, D, kMTiles, kBlockM>(a, smem, stages, whole_call(a.mask, a.seqlen_q, a.seqlen_kv), n0, kv_head,
                                        batch, dq_boxes ? &dq_map : nullptr);
    return;
  }
  // Segments may share keys, so their key tiles can outnumber the grid: stride over them.
  for (int32_t x = int32_t(blockIdx.x);; x += int32_t(gridDim.x)) {
    int32_t seg, tile;
    if (!locate_tile(a.segs, a.nseg, x, C::kBlockN, false, seg, tile)) return;
    const Region reg = segment_region(a.segs[seg]);
    dkdv_tile<T, D, kMTiles, kBlockM>(a, smem, stages, reg, reg.col_begin + tile * C::kBlockN, kv_head, batch,
                                      dq_boxes ? &dq_map : nullptr);
    __syncthreads(); // the next tile reuses shared memory
  }
}

// ---- dQ alone (deterministic mode) ----------------------------------------------------------------

template <class T, int D, int kMTiles>
__global__ void __launch_bounds__(DqConfig<T, D, kMTiles>::kThreads, 1)
    flash_backward_dq_kernel(const __grid_constant__ AttnArgs a) {
  using C = DqConfig<T, D, kMTiles>;
  using Tile = typename C::Tile;
  constexpr int MT = C::kMTiles;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = align_smem(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = reinterpret_cast<T*>(smem + C::kQBytes);
  unsigned char* sK = smem + 2 * C::kQBytes; // two buffers of K, then two of V
  unsigned char* sV = sK + 2 * C::kKBytes;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int head = blockIdx.y, batch = blockIdx.z, kv_head = head / a.group;

  // 1. This CTA's rows [m0, m1) of its region; Q and dO, and the statistics of this lane's rows.
  Region reg;
  int32_t m0;
  if (!locate_rows<C>(a, int32_t(gridDim.x - 1 - blockIdx.x), reg, m0)) return;
  const int32_t m1 = min(m0 + C::kBlockM, reg.row_end);
  const int32_t warp_row0 = warp * C::kWarpRows;
  // This lane's fragment addresses (smem_tile.h), made once; K/V buffer st adds st x kKBytes.
  const uint32_t q_frag = smem_addr(sQ) + Tile::bytes(warp_row0) + Tile::lane_a(lane); // S's A: Q (dP's: dO, + kQBytes)
  const uint32_t k_nk = smem_addr(sK) + Tile::lane_nk(lane), v_nk = smem_addr(sV) + Tile::lane_nk(lane); // S's, dP's B
  const uint32_t k_kn = smem_addr(sK) + Tile::lane_kn(lane); // dQ's B: K

  load_q_do<T, C>(a, sQ, sdO, head, batch, tid, m0, m1);
  const T* k = static_cast<const T*>(a.k.data) + batch * a.k.batch_stride + kv_head * a.k.head_stride;
  const T* v = static_cast<const T*>(a.v.data) + batch * a.v.batch_stride + kv_head * a.v.head_stride;

  float lse2[MT][2], delta[MT][2];
  row_stats<C>(a, head, batch, lane, m0, m1, warp_row0, lse2, delta);

  // 2. The key tiles the rows see, K and V double-buffered.
  KvWalk<C::kBlockN> walk;
  const int list = init_kv_walk<C>(a, reg, head, m0, m1, warp_row0, walk);

  float dq[MT][C::kOTiles][4];
  clear_dq<C>(dq);

  KvStep cur;
  bool have = walk.next(cur, a.mask, reg, m0, m1, a.blocks);
  if (have) load_kv<T, C>(a, sK, sV, k, v, reg, tid, 0, cur.c0);
  cp_async_commit();
  int st = 0;
  while (have) {
    KvStep nxt;
    const bool have_next = walk.next(nxt, a.mask, reg, m0, m1, a.blocks);
    if (have_next) load_kv<T, C>(a, sK, sV, k, v, reg, tid, st ^ 1, nxt.c0);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint32_t buf = st * C::kKBytes;
    const bool active = list ? cur.active[1] : cur.active[0];
    const bool masked = list ? cur.masked[1] : cur.masked[0];
    if (active) {
      // 3. S = Q K^T, dP = dO V^T for this warp's rows.
      float s[MT][C::kSTiles][4], dp[MT][C::kSTiles][4];
      scores_and_dp<T, C, D>(q_frag, k_nk, v_nk, buf, s, dp);
      // 4. dS = P (dP - delta), masked; it replaces S.
      ds_from_scores<C>(a, reg, cur, m0, warp_row0, lane, masked, lse2, delta, s, dp);
      // 5. dQ += dS K.
      add_ds_k<T, C, D>(s, k_kn, buf, dq);
    }
    __syncthreads();
    cur = nxt;
    have = have_next;
    st ^= 1;
  }
  cp_async_wait<0>();

  // 6. dQ out, a plain read-add-write (write_dq says why).
  write_dq<C>(a, head, batch, lane, m0, m1, warp_row0, dq);
}

template <class T, int D, int kMTiles, int kBlockM = 64>
void launch_dkdv(const BackwardParams& p, const AttnArgs& a, size_t smem_allowed, cudaStream_t stream) {
  using C = BackwardConfig<T, D, kMTiles, kBlockM>;
  const auto kernel = flash_backward_dkdv_kernel<T, D, kMTiles, kBlockM>;
  const int stages = smem_allowed >= C::smem_bytes(2) ? 2 : 1;
  size_t smem = C::smem_bytes(stages);
  CUtensorMap dq_map;
  std::memset(&dq_map, 0, sizeof dq_map);
  bool dq_boxes = false;
#if ATTNCORE_HAVE_SM90
  if (C::kDqBoxes && a.accumulate_dq && stages == 2 && smem_allowed >= C::smem_bytes_dq_boxes() &&
      sm90::sm90a_device() && sm90::tma_readable(p.dq, sizeof(float))) {
    dq_map = sm90::make_tile_map(p.dq, DType::fp32, p.batch, p.seqlen_q, p.heads_q, D, C::kDqRows, C::kDqCols,
                                 C::kDqSwizzled ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE);
    dq_boxes = true;
    smem = C::smem_bytes_dq_boxes();
  }
#endif
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  const dim3 grid(unsigned(tile_grid(p.seqlen_kv, C::kBlockN, p.num_segments)), unsigned(p.heads_kv),
                  unsigned(p.batch));
  kernel<<<grid, C::kThreads, smem, stream>>>(a, stages, dq_map, dq_boxes);
  check_launch("flash backward dK/dV");
}

template <class T, int D, int kMTiles> void launch_dq(const BackwardParams& p, const AttnArgs& a, cudaStream_t stream) {
  using C = DqConfig<T, D, kMTiles>;
  const auto kernel = flash_backward_dq_kernel<T, D, kMTiles>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes));
  const dim3 grid(unsigned(tile_grid(p.seqlen_q, C::kBlockM, p.num_segments)), unsigned(p.heads_q), unsigned(p.batch));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
  check_launch("flash backward dQ");
}

// Each kernel takes the first of its shapes whose shared memory the device allows. dK/dV: 128 keys
// a CTA with Q and dO double-buffered (sm_90), then with one stage (sm_80); then 64 keys a CTA, two
// stages, then one, where 128 keys do not fit (D = 80-128 on the 99 KB of an sm_86, sm_89 or
// sm_120). D = 256 has the 64-key shape only, 150,144 bytes with one stage: no 99 KB device runs its
// backward. At D = 64 without a block list, 128 keys and 128-query steps come first (136,320 bytes
// with one stage, so sm_80 and sm_90), FlashAttention-2's tile there: a step's fixed costs (two
// barriers, its statistics, the walk) weigh twice as much on D = 64's short products. (A 128-row
// step would span two query blocks of a 64-row block list, which QWalk does not walk.)
// dQ (deterministic mode): 128 query rows a CTA (98,432 bytes at D = 128), then 64 where that does
// not fit.
// The 64-key and 64-row shapes are compiled only for the head dims that need them.
template <class T, int D> void launch_backward(const BackwardParams& p, cudaStream_t stream) {
  AttnArgs a = backward_args(p);
  a.accumulate_dq = !p.deterministic;
  const size_t smem = max_smem_per_block();
  if constexpr (D == 64) {
    if (!p.blocks && smem >= BackwardConfig<T, D, 2, 128>::smem_bytes(1)) {
      launch_dkdv<T, D, 2, 128>(p, a, smem, stream);
      if (p.deterministic) launch_dq<T, D, 2>(p, a, stream); // (49,280 bytes)
      return;
    }
  }
  constexpr int kTiles = D <= 128 ? 2 : 1;
  using Dkdv = BackwardConfig<T, D, kTiles>;
  using Dq = DqConfig<T, D, kTiles>;
  constexpr bool kDkdvLean = kTiles == 2 && Dkdv::smem_bytes(1) > kSmallestSmem; // D = 80, 96, 128
  constexpr bool kDqLean = kTiles == 2 && Dq::kSmemBytes > kSmallestSmem;        // D = 128
  static_assert(BackwardConfig<T, D, 1>::smem_bytes(1) <= kSmallestSmem || !kDkdvLean, "the 64-key shape fits 99 KB");
  static_assert(DqConfig<T, D, 1>::kSmemBytes <= kSmallestSmem || !kDqLean, "the 64-row shape fits 99 KB");
  const bool dkdv_lean = kDkdvLean && smem < Dkdv::smem_bytes(1);
  const bool dq_lean = kDqLean && smem < Dq::kSmemBytes;
  // Both checked before the first launch: a call the device refuses leaves the gradients alone.
  require_smem(dkdv_lean ? BackwardConfig<T, D, 1>::smem_bytes(1) : Dkdv::smem_bytes(1), smem, "flash backward dK/dV",
               D);
  if (p.deterministic)
    require_smem(dq_lean ? DqConfig<T, D, 1>::kSmemBytes : Dq::kSmemBytes, smem, "flash backward dQ", D);
  if (dkdv_lean) {
    if constexpr (kDkdvLean) launch_dkdv<T, D, 1>(p, a, smem, stream);
  } else {
    launch_dkdv<T, D, kTiles>(p, a, smem, stream);
  }
  if (!p.deterministic) return;
  if (dq_lean) {
    if constexpr (kDqLean) launch_dq<T, D, 1>(p, a, stream);
  } else {
    launch_dq<T, D, kTiles>(p, a, stream);
  }
}

} // namespace attncore::cuda
