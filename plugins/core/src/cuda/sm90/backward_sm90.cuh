// Flash-attention backward on Hopper (sm_90a): the mma.sync kernel's algorithm (backward.cuh) on
// warpgroup matrix products and bulk tensor copies, with warp specialization (FlashAttention-3's
// structure). From the final O's LSE and delta = rowsum(dO * O):
//     P = exp(scale q.k - LSE),  dP = dO V^T,  dS = P (dP - delta),
//     dV += P^T dO,  dK += scale dS^T Q,  dQ += scale dS K.
//
// A CTA of three warpgroups owns kBlockN = 128 keys of one (batch, kv head) (64 at d256) and walks
// every (query head of the GQA group, 64-row query tile; 128 rows at d64 and 80 at d128 for the
// long calls launch_backward_sm90 names) that sees them (QWalk, as the mma.sync kernel).
//  - Warpgroup 0, warp 0: the producer. K and V once per key tile; per step, Q and dO into a ring of
//    kStages buffers by the copy engine, and the step's record (query head, first row, block-list
//    flags, the rows' LSE and delta) written beside them by the warp's lanes. Rows of a tile past
//    a segment's end inside the tensor are zeroed by the consumers before they read it.
//  - Warpgroups 1 and 2: the consumers, 64 keys each (at d256 the same 64 keys, each consumer
//    with half of dK's and dV's columns, see BackwardConfig). Per step:
//        S^T = K Q^T, dP^T = V dO^T          (wgmma; Q, dO in shared memory, K and V there or, for
//                                             the first k-steps that fit, in registers)
//        P^T, dS^T in registers               (masked: a key or row outside the mask gives 0)
//        dV += P^T dO, dK += dS^T Q           (wgmma, P^T and dS^T straight from registers)
//        dQ part = dS K (dS^T through shared memory): by columns between the consumers at d128,
//        else over each consumer's keys; issued before dK's product (up to d128), so that the
//        part is stored while the tensor cores run dK. With 80-query steps, dQ^T = K^T dS^T (dS
//        through shared memory, query-major), the part stored transposed
//    and dK, dV are added into the fp32 accumulators once, at the end of the key tile.
//  - Warpgroup 0, warps 1-3: the dQ reducer, off the consumers' path. Per step the step's dQ goes
//    into the fp32 dQ accumulator: 32-column chunks added in L2 by the copy engine, issued by warp 1
//    (d96, d128, d256), or vector atomics by the three warps, the two parts summed first (DqAdd).
// Segments that share keys can give more key tiles than CTAs: a CTA strides over them, every role
// walking the same sequence of tiles.
// An FP8 call (launch_backward_sm90_fp8, where fp8_products_serve) runs S^T, dP^T and dV's products
// in e4m3 on Q, K, V and dO as given and on dO^T, P^T a scale a key row (scale_p_rows), and dK's
// and dQ's in bf16 on Q widened once a call and K widened a key tile by the consumers
// (widen_k_block; BackwardConfig::kFp8).
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../args.h"
#include "../launch.h"
#include "../pieces.h"
#include "backward_sm90_steps.cuh"
#include "tensor_map.h"
#include "../../workspace_bytes.h"

namespace attncore::cuda::sm90 {

template <class T, int D, int kBlockM, bool kFp8>
__global__ void __launch_bounds__(BackwardConfig<T, D, kBlockM, kFp8>::kThreads, 1)
    flash_backward_sm90_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                               const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                               const __grid_constant__ CUtensorMap dq_map, const __grid_constant__ BackwardFp8Maps f8,
                               const __grid_constant__ AttnArgs a, DqAdd dq_add) {
#if ATTNCORE_SM90_DEVICE
  using C = BackwardConfig<T, D, kBlockM, kFp8>;
  using L = BackwardSmem<T, D, kBlockM, kFp8>;
  using Record = StepRecord<kBlockM>;
  constexpr int W = C::W;
  // The consumers wait at this barrier for the reducer's count (AttnArgs::dq_done).
  constexpr int kDqDoneBarrier = 4, kDqDoneThreads = C::kConsumers * 128 + 32;
  // 1. Shared memory (BackwardSmem::Regions), this thread's role, the barriers.
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_smem<1024>(smem_raw);
  const auto [sK, sV, sQ, sdO, sdS, sDq, steps, dq_rec, piece, kv_full, kv_empty, dq_full, dq_empty, q_full, q_empty,
              sQ8] = L::regions(smem);

  const int tid = threadIdx.x, warp = warp_uniform(int(tid / 32)), lane = tid % 32, group = warp / 4;

  if (tid == 0) init_barriers<C>(kv_full, kv_empty, dq_full, dq_empty, q_full, q_empty, piece, a, dq_add);
  __syncthreads();
  const int batch = a.tail.parts > 1 ? piece->batch : int(blockIdx.z);

  if (group == 0) {
    regs_dealloc<C::kProducerRegs>();
    if (warp == 0) { // 2. The producer: K and V a key tile; Q, dO and the record a step.
      produce_steps<C, D, T>(smem, k_map, v_map, q_map, do_map, f8, a, batch, lane);
    } else if (dq_add != DqAdd::copy_engine || warp == 1) { // 3. The dQ reducer: each step's part into dQ.
      const int rt = tid - 32; // 0 .. kReducers - 1
      for (uint32_t round = 0;; ++round) {
        barrier_wait(dq_full, round & 1);
        const DqRecord rec = *dq_rec;
        if (rec.head < 0) break;
        add_dq_part<C, D>(rec, a, dq_map, dq_add, sDq, batch, rt, lane);
        __syncwarp();
        if (lane == 0) barrier_arrive(dq_empty);
      }
      // No wait for the last adds to land: each round waited for its part's reads, and a grid's
      // bulk copies are complete when the grid is, so the CTA's end does not wait on L2. Unless dQ
      // is written rounded (dq_done, copy-engine adds only): then the CTA counts in once they are.
      if (C::kDqOutInKernel && a.dq_done) {
        if (lane == 0) count_dq_adds(a, dq_rec, batch, piece->run);
        __syncwarp();
        named_barrier_arrive(kDqDoneBarrier, kDqDoneThreads);
      }
    }
    return;
  }

  // 4. The consumers: per key tile, every step of queries (steps 1-7 of backward_sm90_steps.cuh), then
  // dK and dV out.
  regs_alloc<C::kConsumerRegs>();
  const int wg = group - 1, warp_in_wg = warp % 4;
  const int keys0 = C::kKeys0 * wg;          // this consumer's first key in the tile
  const int key0 = keys0 + 16 * warp_in_wg; // this warp's
  const int col0 = C::kSharedKeys ? wg * (D / 2) : 0; // where the consumer's dK/dV columns start (d256: its half)
  const auto [k_desc, v_desc, kb_desc, q_desc, do_desc, qb_desc, dob_desc, ds_desc, ds_qmajor_desc] =
      operand_descriptors<C, D>(sK, sV, sQ, sdO, sQ8, sdS, wg, keys0, col0);
  // This warp's first row of dS^T, and this lane's addresses in its dQ part (shared addresses).
  const uint32_t ds_row0 = smem_addr(sdS) + uint32_t(wg * C::kDsBytes + 16 * warp_in_wg * 128);
  uint32_t dq_lane0, dq_unit[4], dqt_lane[4];
  int dq_rot;
  dq_part_addresses<C, D>(dq_lane0, dq_unit, dqt_lane, dq_rot, sDq, wg, warp_in_wg, lane);

  float dk[C::kOTiles][4], dv[C::kOTiles][4];
  PRowScales p_rows; // (FP8 products)
  uint32_t step = 0, round = 0;
  Region reg;
  int32_t n0;
  for (int32_t i = 0; key_tile<C>(a, piece, i, reg, n0); ++i) {
    zero_grads<C>(dk, dv);
    if constexpr (C::kFp8) p_rows[0] = p_rows[1] = kPRowScaleMax;
    // With a block list of 64-key blocks, each consumer's keys are one block of the tile.
    const int list = C::kBlockLists && a.blocks.heads > 0 && (n0 + keys0) / a.blocks.block_kv != n0 / a.blocks.block_kv ? 1 : 0;
    barrier_wait(kv_full, i & 1);
    clean_kv<C, D>(sK, sV, a, reg, n0, tid);
    if constexpr (C::kFp8) widen_k_block<C>(sK, sV, f8.descale_k, wg, tid % 128);
    // This warp's 16 keys of K and V as A fragments of S^T and dP^T (kKeyRegSteps, kValueRegSteps).
    uint32_t ka[a_steps(C::kKeyRegSteps)][4], va[a_steps(C::kValueRegSteps)][4];
    load_a_fragments<W, C::kBlockN, C::kKeyRegSteps>(ka, sK, key0, lane);
    load_a_fragments<W, C::kBlockN, C::kValueRegSteps>(va, sV, key0, lane);

    for (;; ++step) {
      const uint32_t s = step % C::kStages;
      barrier_wait(&q_full[s], (step / C::kStages) & 1);
      const Record& rec = steps[s];
      const int32_t head = rec.head, r0 = rec.r0;
      if (warp_uniform(head < 0)) {
        __syncwarp();
        if (lane == 0) barrier_arrive(&q_empty[s]);
        ++step;
        break;
      }
      clean_q_do<C, D>(sQ, sdO, a, s, reg, r0, tid);
      const uint32_t flags = rec.flags;
      const bool active = (flags >> list) & 1u, masked = (flags >> (2 + list)) & 1u;
      const bool needs_mask = warp_uniform(!active || masked || n0 + keys0 + 64 > reg.col_end);

      float st[C::kMTiles][4], dpt[C::kMTiles][4];
      scores_and_dp<C, T, D>(st, dpt, ka, va, k_desc, v_desc, q_desc, do_desc, s); // 1.
      PFrags<C> pa;
      probabilities<C, T>(pa, st, a, rec.lse2, reg, needs_mask, active, masked, r0, n0, key0, lane); // 2.
      if constexpr (C::kFp8) scale_p_rows<C>(pa, dv, p_rows, st); // 2'.
      uint32_t dsa[C::kMTiles / 2][4];
      // dV += P^T dO, dK += dS^T Q (here, or after dQ's product: kDkAfterDq). Where dK's product
      // follows dQ's, dV's does not need dS^T and runs under its arithmetic (kDvUnderDs).
      const auto dk_product = [&] { issue_dk_product<C, T>(dk, dsa, qb_desc, s); };
      const auto release_stage = [&] { release_q_stage<C>(dk, dsa, &q_empty[s], lane); };
      if constexpr (C::kDvUnderDs) dv_dk_products<C, T>(dv, pa, dob_desc, s, dk_product); // 4.
      score_grads<C, T>(dsa, dpt, st, rec.delta, a.dp_scale, lane); // 3.
      if constexpr (!C::kDvUnderDs) dv_dk_products<C, T>(dv, pa, dob_desc, s, dk_product); // 4.
      const uint32_t ds_buf = C::kDsShared ? (round & 1) : 0;
      store_ds<C>(dsa, sdS, ds_row0, ds_buf, wg, warp_in_wg, lane); // 5.
      if constexpr (!C::kDkAfterDq) { // one stage of Q and dO: free it for the next step's load now
        wgmma_wait<0>();
        fence_registers(dv);
        fence_registers(pa);
        release_stage();
      }

      constexpr bool kTall = kTallSteps<C>;
      DqTiles<C> dq;
      DqHiTiles<C> dq_hi;
      dq_product<C, T>(dq, dq_hi, kb_desc, ds_desc, ds_qmajor_desc, ds_buf, wg); // 6.
      if constexpr (C::kDkAfterDq) {
        dk_product();
        wgmma_commit();
        wgmma_wait<1>(); // dV and dQ's part
      } else {
        wgmma_wait<0>();
      }
      fence_registers(dq);
      if constexpr (kTall) fence_registers(dq_hi);
      fence_registers(dv);
      fence_registers(pa);

      // 7. The part (times the softmax scale unless dS^T holds it) to the reducer once it is done
      // with the last parts.
      barrier_wait(dq_empty, (round & 1) ^ 1);
      store_dq_part<C>(dq, dq_hi, C::kScaleInDs ? 1.f : a.scale, dq_lane0, dq_unit, dqt_lane, dq_rot);
      if (wg == 0 && warp_in_wg == 0 && lane == 0) *dq_rec = DqRecord{head, r0, min(C::kBlockM, reg.row_end - r0), 0};
      if constexpr (C::kDqByCopyEngine) fence_async_shared(); // the copy engine reads the part
      __syncwarp();
      if (lane == 0) barrier_arrive(dq_full);
      if constexpr (C::kDkAfterDq) {
        wgmma_wait<0>(); // dK: the last product that read Q
        release_stage();
      }
      ++round;
    }

    if constexpr (C::kFp8) unscale_dv_rows<C>(dv, p_rows);
    store_dkdv<C, T>(dk, dv, a, piece, kv_empty, reg, n0, key0, col0, piece->kv_head, batch, lane);
  }
  end_reducer(dq_rec, dq_full, dq_empty, round, wg == 0 && warp_in_wg == 0 && lane == 0, lane);
  // 5. dQ written rounded: the CTA whose adds were its query head's last rounds the head's rows.
  if (C::kDqOutInKernel && a.dq_done) {
    named_barrier_sync(kDqDoneBarrier, kDqDoneThreads);
    if (dq_rec->last) write_dq_out<C, D, T>(a, batch, piece->run, tid - 128);
  }
#endif
}


// A kv head's query heads cut over several CTAs a key tile (GQA), where a call has too few CTAs for
// its longest walk to end with the rest: a causal call's first key tile walks every row of every
// query head of its group, about twice the mean, so it wants four CTAs an SM, a full call two; but
// no CTA walks fewer than kMinSplitRows rows (query heads x rows), where a split would pay a key
// tile's start and its dK/dV atomics for little. Two H200s, zigzag at world size 2, B=2, 2 kv heads
// of 16 query heads at d64, 8192 keys a rank (256 CTAs a call): the own block's causal call ran 1.5x
// the other block's full call of as many pairs; cut in 4, the backward went 8.95 -> 7.72 ms
// (docs/KERNELS.md, "GQA groups over several CTAs"). The parts add dK and dV by atomics, so not where
// the call writes them in the dtype, adds a share first, walks by pieces or must be reproducible; a
// call that writes them in fp32 has them zeroed first instead (every key of it). Plain calls only:
// a window's, a segment's or a block list's walk is shorter than its rows (not measured). Each key's
// gradients are then a sum of several adds, not one. ATTNCORE_HEAD_SPLITS=N forces N (a divisor of
// the group) where a split is allowed, for tests.
constexpr int64_t kMinSplitRows = 16384;
// Runs of query heads a group of the causal order counts (cta_place; docs/KERNELS.md, "Heaviest key
// tiles first").
constexpr int32_t kTileGroupRuns = 4;
// `plain`: no block list, pieces, segments or window (launch_backward_config).
inline int32_t backward_head_splits(const BackwardParams& p, const AttnArgs& a, int64_t ctas, bool plain) {
  if (a.group == 1 || !plain || p.deterministic || p.dk_add.data || a.dkdv_out == GradOut::write_dtype) return 1;
  const auto dense_rows = [&](const TensorRef& t) {
    return t.head_stride == p.head_dim && t.token_stride == int64_t{p.heads_kv} * p.head_dim;
  };
  if (a.dkdv_out == GradOut::write_fp32 && (!dense_rows(p.dk) || !dense_rows(p.dv))) return 1;
  if (const char* forced = std::getenv("ATTNCORE_HEAD_SPLITS")) {
    const int32_t s = std::atoi(forced);
    return s > 0 && a.group % s == 0 ? s : 1;
  }
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t wanted = int64_t{p.mask.causal ? 4 : 2} * sms;
  int32_t splits = 1;
  for (int32_t s = 2; s <= a.group && ctas * splits < wanted; ++s)
    if (a.group % s == 0 && int64_t{a.group / s} * p.seqlen_q >= kMinSplitRows) splits = s;
  return splits;
}

// The last wave in parts (cta_order.h, TailSplit): where a full call's equal CTAs leave the last
// wave at most half full, its tiles are cut by rows so that every SM takes a share, their dK and dV
// summed in the workspace (tail_sums: which calls, tail_call; without room there, none). At B=4 H=32 S=16384 D=128 the
// backward's 16384 CTAs are 124 waves of 132 and 16 over (docs/KERNELS.md, "The last wave in
// parts"). ATTNCORE_TAIL_SPLIT=T,P forces T tiles in P parts where the call allows a split, "0"
// none, for tests.
inline void split_last_wave(const BackwardParams& p, AttnArgs& a, dim3& grid, int32_t rows_a_step, cudaStream_t stream) {
  float* sums = tail_sums(p);
  if (!sums) return;
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t steps = (p.seqlen_q + rows_a_step - 1) / rows_a_step * (a.group / a.head_splits);
  TailSplit s = tail_split(int32_t(grid.x), int32_t(grid.y), int32_t(grid.z), steps, sms);
  if (const char* forced = std::getenv("ATTNCORE_TAIL_SPLIT")) {
    const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
    int32_t tail = 0, parts = 1;
    if (std::sscanf(forced, "%d,%d", &tail, &parts) != 2 || tail < 1 || tail > std::min<int64_t>(kMaxTailTiles, ctas) ||
        parts < 2 || parts > steps)
      tail = 0, parts = 1;
    s = TailSplit{int32_t(grid.x), int32_t(grid.y), ctas - tail, tail, parts};
  }
  if (s.parts < 2) return;
  a.tail = s;
  a.tail_done = reinterpret_cast<int32_t*>(sums);
  a.tail_sums = sums + kMaxTailTiles * kTailWarps;  // (the counters first, 2 KiB)
  cudaMemsetAsync(sums, 0, (kMaxTailTiles * kTailWarps + size_t(s.tail) * kTailSlotFloats) * sizeof(float), stream);
  check_launch("clearing the last wave's sums (sm90)");
  grid = dim3(unsigned(s.whole + int64_t(s.tail) * s.parts), 1, 1);
}

// An FP8 call's e4m3 operands for the backward with FP8 products: the call as given (Q, K, V, dO
// and their descales) and dO^T (transpose_fp8).
struct Fp8Operands {
  const BackwardParams& fp8;
  Fp8Transposed dot;
};

// p: the call (bf16 or fp16); or, with FP8 products, the call with Q widened to bf16 (f8: the e4m3
// operands; p's K, a slot left unwritten, is read by no copy of that kernel).
template <class T, int D, int kBlockM, bool kFp8 = false>
bool launch_backward_config(const BackwardParams& p, cudaStream_t stream, const Fp8Operands* f8 = nullptr) {
  using C = BackwardConfig<T, D, kBlockM, kFp8>;
  AttnArgs a = backward_args(p);
  const bool by_pieces = share_out_pieces(p, a, stream);
  const CUtensorMapSwizzle sw = tma_swizzle(C::W);
  const CUtensorMap q_map = make_tile_map(p.q, p.dtype, p.batch, p.seqlen_q, p.heads_q, D, C::kBlockM, C::W, sw);
  const CUtensorMap k_map = make_tile_map(p.k, p.dtype, p.batch, p.seqlen_kv, p.heads_kv, D, C::kBlockN, C::W, sw);
  CUtensorMap do_map, v_map;
  BackwardFp8Maps f8_maps;
  std::memset(&f8_maps, 0, sizeof f8_maps);
  if constexpr (kFp8) {
    // e4m3 rows of D bytes (W8 16-bit columns), one column block; dO^T's rows a step's queries.
    const BackwardParams& e = f8->fp8;
    const DType e4m3 = DType::fp8_e4m3;
    const CUtensorMapSwizzle sw8 = tma_swizzle(C::W8);
    f8_maps.q8 = make_tile_map(e.q, e4m3, p.batch, p.seqlen_q, p.heads_q, D, C::kBlockM, 2 * C::W8, sw8);
    f8_maps.k8 = make_tile_map(e.k, e4m3, p.batch, p.seqlen_kv, p.heads_kv, D, C::kBlockN, 2 * C::W8, sw8);
    do_map = make_tile_map(e.d_o, e4m3, p.batch, p.seqlen_q, p.heads_q, D, C::kBlockM, 2 * C::W8, sw8);
    v_map = make_tile_map(e.v, e4m3, p.batch, p.seqlen_kv, p.heads_kv, D, C::kBlockN, 2 * C::W8, sw8);
    f8_maps.dot = make_tile_map(f8->dot.ref, e4m3, p.batch, D, p.heads_q, int32_t(f8->dot.tokens), D, 2 * C::WT,
                                tma_swizzle(C::WT));
    f8_maps.descale_k = e.descale_k;
    a.scale_log2 *= e.descale_q * e.descale_k;
    a.dp_scale = e.descale_v * e.descale_do;
    a.dv_scale = e.descale_do;
  } else {
    do_map = make_tile_map(p.d_o, p.dtype, p.batch, p.seqlen_q, p.heads_q, D, C::kBlockM, C::W, sw);
    v_map = make_tile_map(p.v, p.dtype, p.batch, p.seqlen_kv, p.heads_kv, D, C::kBlockN, C::W, sw);
  }
  if constexpr (C::kScaleInDs) a.dp_scale *= a.scale;
  // dQ chunks added by the copy engine where the head dim and the accumulator allow it.
  const DqAdd dq_add = C::kDqByCopyEngine && tma_readable(p.dq, 4) ? DqAdd::copy_engine
                       : tma_readable(p.dq, 4)                     ? DqAdd::quads
                                                                   : DqAdd::pairs;
  CUtensorMap dq_map;
  std::memset(&dq_map, 0, sizeof dq_map);
  if (dq_add == DqAdd::copy_engine)
    dq_map = make_tile_map(p.dq, DType::fp32, p.batch, p.seqlen_q, p.heads_q, D, C::kBlockM, 32,
                           CU_TENSOR_MAP_SWIZZLE_128B);
  const auto kernel = flash_backward_sm90_kernel<T, D, kBlockM, kFp8>;
  constexpr size_t smem = BackwardSmem<T, D, kBlockM, kFp8>::kBytes;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  const int64_t tiles = by_pieces ? piece_tiles(p, C::kBlockN) : tile_grid(p.seqlen_kv, C::kBlockN, p.num_segments);
  const bool plain = plain_call(p) && !by_pieces;
  a.head_splits = backward_head_splits(p, a, tiles * p.heads_kv * p.batch, plain);
  a.tile_groups = plain && p.mask.causal ? kTileGroupRuns : 0;  // (a window's tiles weigh alike)
  if (a.head_splits > 1 && a.dkdv_out == GradOut::write_fp32) {  // written: zeroed, then added into
    for (const TensorRef& t : {p.dk, p.dv}) {
      const size_t width = size_t(p.seqlen_kv) * t.token_stride * 4;
      cudaMemset2DAsync(t.data, std::max(width, size_t(t.batch_stride) * 4), 0, width, size_t(p.batch), stream);
      check_launch("zeroing dK and dV (sm90)");
    }
    a.dkdv_out = GradOut::add_fp32;
  }
  // dQ rounded into dq_out by each query head's last CTA (kDqOutInKernel), where the CTAs add by the
  // copy engine (the count waits for their bulk groups), each into one query head, with the counters
  // in the call's workspace (the FP8 call's as given). Else the caller's pass does it (false).
  const auto rows_of_4 = [](const TensorRef& t) {
    return reinterpret_cast<uintptr_t>(t.data) % 8 == 0 && t.batch_stride % 4 == 0 && t.token_stride % 4 == 0 &&
           t.head_stride % 4 == 0;
  };
  const BackwardParams& given = kFp8 ? f8->fp8 : p;
  const bool rounds_dq = C::kDqOutInKernel && p.dq_out.data && dq_add == DqAdd::copy_engine && plain &&
                         a.group / a.head_splits == 1 && rows_of_4(p.dq_out);
  a.dq_done = rounds_dq ? dq_counters(given) : nullptr;
  if (a.dq_done) {
    a.dq_out = p.dq_out;
    cudaMemsetAsync(a.dq_done, 0, dq_counters_bytes(given), stream);
    check_launch("clearing the dQ counters (sm90)");
  }
  dim3 grid(unsigned(tiles), unsigned(p.heads_kv * a.head_splits), unsigned(p.batch));
  if (a.head_splits == 1) split_last_wave(p, a, grid, C::kBlockM, stream);
  kernel<<<grid, C::kThreads, smem, stream>>>(q_map, k_map, v_map, do_map, dq_map, f8_maps, a, dq_add);
  check_launch("flash backward (sm90)");
  write_split_sums(p, a, stream);
  return a.dq_done != nullptr;
}

// Tall steps (128 queries) at d64, for rows of at least 4096 queries and without block lists (a
// step would span two query blocks): a step's fixed costs (the waits between its products, the dS^T
// exchange, the dQ part's handoff) are paid once for twice the work. Measured (docs/KERNELS.md,
// "128-query steps at d64"): +3% at 8192 rows, +1-2% at 4096, -3% at 1024 (fewer steps a key tile to fill and
// drain the pipeline). A call with segments qualifies by its total length, as for the forward's pair.
// 80-query steps at d128 (FlashAttention-3's tile for full masks), plain calls without a window, of at
// least 1024 rows (4096 causal), where the dQ part can be added by the copy engine: measured
// (docs/KERNELS.md, "80-query steps at d128") +5% at the reference shape full and +4% causal, +5-14% at 4096-8192 rows
// full, +1-2.5% causal there; causal at 1024 rows -1.5%, 2048 mixed. Segments keep 64-row steps (untried).
template <class T, int D> bool launch_backward_sm90(const BackwardParams& p, cudaStream_t stream) {
  if constexpr (D == 64) {
    if (!p.blocks && p.seqlen_q >= 4096) return launch_backward_config<T, D, 128>(p, stream);
  }
  if constexpr (D == 128) {
    const int64_t min_rows = p.mask.causal ? 4096 : 1024;
    if (plain_call(p) && p.seqlen_q >= min_rows && tma_readable(p.dq, 4))
      return launch_backward_config<T, D, 80>(p, stream);
  }
  return launch_backward_config<T, D, 64>(p, stream);
}

// The backward of an FP8 call with e4m3 products (BackwardConfig::kFp8), where it serves
// (fp8_products_serve): widened holds Q in bf16 (widen_fp8_inputs), and dO's slot of the
// workspace takes dO^T. Measured against the bf16 kernels on all four inputs widened in
// docs/KERNELS.md, "FP8 backward".
template <int D> bool launch_backward_sm90_fp8(const BackwardParams& fp8, const BackwardParams& widened, cudaStream_t stream) {
  // What the kernel takes for granted (fp8_products_serve routes only such calls): no segment, block
  // list or window (its tiles skip the cleaning of rows past a segment's end), dO^T within dO's slot.
  if (!plain_call(fp8) || fp8.seqlen_q < 32 || fp8.deterministic)
    throw Error("attncore: the FP8 backward's e4m3 products take plain calls of at least 32 rows, not deterministic");
  const Fp8Operands f8{fp8, transpose_fp8<D>(fp8.d_o, static_cast<uint8_t*>(widened.d_o.data), fp8.seqlen_q,
                                             fp8.heads_q, fp8.batch, stream, "dO^T (FP8 backward)")};
  return launch_backward_config<__nv_bfloat16, D, 64, true>(widened, stream, &f8);
}

} // namespace attncore::cuda::sm90
