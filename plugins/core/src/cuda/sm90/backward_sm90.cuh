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
#pragma once

#include <cuda.h>

#include <cstring>

#include "../args.h"
#include "../launch.h"
#include "../pieces.h"
#include "backward_sm90_steps.cuh"
#include "tensor_map.h"

namespace attncore::cuda::sm90 {

template <class T, int D, int kBlockM>
__global__ void __launch_bounds__(BackwardConfig<T, D, kBlockM>::kThreads, 1)
    flash_backward_sm90_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                               const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                               const __grid_constant__ CUtensorMap dq_map, const __grid_constant__ AttnArgs a,
                               DqAdd dq_add) {
#if ATTNCORE_SM90_DEVICE
  using C = BackwardConfig<T, D, kBlockM>;
  using L = BackwardSmem<T, D, kBlockM>;
  using Record = StepRecord<kBlockM>;
  constexpr int W = C::W;
  // 1. Shared memory (BackwardSmem), this thread's role, the barriers.
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_smem<1024>(smem_raw);
  T* sK = reinterpret_cast<T*>(smem + L::kK);
  T* sV = reinterpret_cast<T*>(smem + L::kV);
  T* sQ = reinterpret_cast<T*>(smem + L::kQ);   // kStages tiles
  T* sdO = reinterpret_cast<T*>(smem + L::kDO); // kStages tiles
  // [buffer][consumer]: [64 keys][kBlockM queries] tiles; with 80-query steps [80 queries][64 keys]
  T* sdS = reinterpret_cast<T*>(smem + L::kDS);
  float* sDq = reinterpret_cast<float*>(smem + L::kDQ);
  Record* steps = reinterpret_cast<Record*>(smem + L::kSteps);
  DqRecord* dq_rec = reinterpret_cast<DqRecord*>(smem + L::kDqRec);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* kv_full = bars;
  uint64_t* kv_empty = bars + 1;
  uint64_t* dq_full = bars + 2;
  uint64_t* dq_empty = bars + 3;
  uint64_t* q_full = bars + 4;
  uint64_t* q_empty = q_full + C::kStages;

  const int tid = threadIdx.x, warp = warp_uniform(int(tid / 32)), lane = tid % 32, group = warp / 4;
  const int kv_head = blockIdx.y, batch = blockIdx.z;
  // With a block list cut in pieces, this CTA's piece, in shared memory: held in registers by
  // every role, or loaded where each role needs it, it spilled the producer (24 registers) at d128.
  TilePiece* piece = reinterpret_cast<TilePiece*>(smem + L::kPiece);

  if (tid == 0) init_barriers<C>(kv_full, kv_empty, dq_full, dq_empty, q_full, q_empty, piece, a, dq_add);
  __syncthreads();

  // The key tiles of this CTA, in the same order for every role: one, or a stride over segments.
  const auto tile_at = [&](int32_t i, Region& reg, int32_t& n0) {
    const int32_t x = int32_t(blockIdx.x) + i * int32_t(gridDim.x);
    if (a.nseg == 0) {
      reg = whole_call(a.mask, a.seqlen_q, a.seqlen_kv);
      n0 = a.blocks.pieces ? piece->n0 : x * C::kBlockN;
      return i == 0 && n0 < a.seqlen_kv;
    }
    int32_t seg, tile;
    if (!locate_tile(a.segs, a.nseg, x, C::kBlockN, false, seg, tile)) return false;
    reg = segment_region(a.segs[seg]);
    n0 = reg.col_begin + tile * C::kBlockN;
    return true;
  };

  if (group == 0) {
    regs_dealloc<C::kProducerRegs>();
    if (warp == 0) { // 2. The producer: K and V a key tile; Q, dO and the record a step.
      uint32_t step = 0;
      Region reg;
      int32_t n0;
      for (int32_t i = 0; tile_at(i, reg, n0); ++i) {
        barrier_wait(kv_empty, (i & 1) ^ 1);
        if (lane == 0) load_kv<C, D>(sK, sV, k_map, v_map, kv_full, n0, kv_head, batch);
        QWalk<C::kBlockM, C::kBlockN> walk;
        const BlockArgs no_list{};
        const BlockArgs& blocks = C::kBlockLists ? a.blocks : no_list;
        walk.init(a.mask, reg, blocks, kv_head * a.group, a.group, n0);
        for (;; ++step) {
          const uint32_t s = step % C::kStages;
          QStep q;
          const bool more = walk.next(q, a.mask, reg, blocks, n0);
          barrier_wait(&q_empty[s], ((step / C::kStages) & 1) ^ 1);
          Record& rec = steps[s];
          if (!more) {
            if (lane == 0) {
              rec.head = -1;
              barrier_arrive(&q_full[s]);
            }
            ++step;
            break;
          }
          // The step's copies first, so that their latency runs under the lanes' loads of the rows'
          // LSE and delta; lane 0's arrive below completes the phase with their bytes.
          if (lane == 0) load_q_do<C, D>(sQ, sdO, q_map, do_map, &q_full[s], s, q, batch);
          // The step's record: the rows' LSE (log2 units) and delta by the lanes, the rest by lane 0.
          const float* lse = a.lse.data + batch * a.lse.batch_stride + q.head * a.lse.head_stride;
          const float* dlt = a.delta.data + batch * a.delta.batch_stride + q.head * a.delta.head_stride;
#pragma unroll
          for (int h = 0; h < (C::kBlockM + 31) / 32; ++h) {
            if (32 * h + 32 > C::kBlockM && lane + 32 * h >= C::kBlockM) continue; // 80 rows: the last 16
            const int32_t r = q.r0 + lane + 32 * h;
            float lse2 = INFINITY, delta = 0.f;
            if (r < reg.row_end) {
              const float l = lse[r];
              lse2 = l == -INFINITY ? INFINITY : l * kLog2e; // a row without keys: P = 0
              delta = dlt[r];
            }
            rec.lse2[lane + 32 * h] = lse2;
            rec.delta[lane + 32 * h] = delta;
          }
          if (lane == 0) {
            rec.head = q.head;
            rec.r0 = q.r0;
            rec.flags = uint32_t(q.active[0]) | uint32_t(q.active[1]) << 1 | uint32_t(q.masked[0]) << 2 |
                        uint32_t(q.masked[1]) << 3;
          }
          __syncwarp(); // the lanes' stores, then lane 0's arrive publishes them (release)
          if (lane == 0) barrier_arrive(&q_full[s]);
        }
      }
    } else if (dq_add != DqAdd::copy_engine || warp == 1) { // 3. The dQ reducer: each step's part into dQ.
      const int rt = tid - 32; // 0 .. kReducers - 1
      for (uint32_t round = 0;; ++round) {
        barrier_wait(dq_full, round & 1);
        const DqRecord rec = *dq_rec;
        if (rec.head < 0) break;
        float* dq = static_cast<float*>(a.dq.data) + batch * a.dq.batch_stride + rec.head * a.dq.head_stride;
        if (dq_add == DqAdd::copy_engine) {
          // Whole chunks of the step's rows: rows past the region add zeros (their P and dS are 0),
          // rows past the tensor are dropped. One thread: each lane's instruction would be a reduction.
          if (lane == 0) {
            for (int part = 0; part < C::kDqParts; ++part) {
              const unsigned char* chunks = reinterpret_cast<const unsigned char*>(sDq) + part * C::kDqBytes;
              for (int c = 0; c < D / 32; ++c)
                tma_reduce_add_4d(&dq_map, chunks + c * C::kBlockM * 128, c * 32, rec.r0, rec.head, batch);
            }
            bulk_commit();
            bulk_wait_read();
          }
        } else {
          const unsigned char* parts = reinterpret_cast<const unsigned char*>(sDq);
          for (int i = rt; i < rec.rows * (D / 4); i += C::kReducers) {
            const int row = i / (D / 4), col = (i % (D / 4)) * 4;
            float4 x = *reinterpret_cast<const float4*>(parts + dq_part_offset<C>(row, col));
            if constexpr (C::kDqParts == 2) {
              const float4 y = *reinterpret_cast<const float4*>(parts + C::kDqBytes + dq_part_offset<C>(row, col));
              x = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
            }
            float* dst = dq + int64_t(rec.r0 + row) * a.dq.token_stride + col;
            if (dq_add == DqAdd::quads) {
              atomicAdd(reinterpret_cast<float4*>(dst), x);
            } else {
              atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x.x, x.y));
              atomicAdd(reinterpret_cast<float2*>(dst + 2), make_float2(x.z, x.w));
            }
          }
        }
        __syncwarp();
        if (lane == 0) barrier_arrive(dq_empty);
      }
      // No wait for the last adds to land: each round waited for its part's reads, and a grid's
      // bulk copies are complete when the grid is, so the CTA's end does not wait on L2.
    }
    return;
  }

  // 4. The consumers: per key tile, every step of queries (steps 1-7 of backward_sm90_steps.cuh), then
  // dK and dV out.
  regs_alloc<C::kConsumerRegs>();
  const int wg = group - 1, warp_in_wg = warp % 4;
  const int keys0 = C::kKeys0 * wg;          // this consumer's first key in the tile
  const int key0 = keys0 + 16 * warp_in_wg; // this warp's
  // Where the consumer's dK/dV columns start (d256: its half), and that half as a descriptor offset
  // into an MN-major tile of `rows` rows.
  const int col0 = C::kSharedKeys ? wg * (D / 2) : 0;
  const auto half_of = [&](int rows) { return desc_offset(uint32_t((col0 / W) * rows * W * 2)); };

  const uint64_t k_desc = desc_k_major<W>(sK, C::kBlockN, keys0);
  const uint64_t v_desc = desc_k_major<W>(sV, C::kBlockN, keys0);
  // K as dQ's B: this consumer's keys (dQ by keys), or every key and this consumer's columns.
  const uint64_t kb_desc = desc_mn_major<W>(sK, C::kBlockN) +
                           (C::kSplitDq ? desc_offset(uint32_t(wg * (D / 2 / W) * C::kBlockN * W * 2))
                                        : mn_major_step<W>(keys0));
  const uint64_t q_desc = desc_k_major<W>(sQ, C::kBlockM, 0);       // Q as S^T's B
  const uint64_t do_desc = desc_k_major<W>(sdO, C::kBlockM, 0);     // dO as dP^T's B
  const uint64_t qb_desc = desc_mn_major<W>(sQ, C::kBlockM) + half_of(C::kBlockM);   // Q as dK's B
  const uint64_t dob_desc = desc_mn_major<W>(sdO, C::kBlockM) + half_of(C::kBlockM); // dO as dV's B
  const uint64_t ds_desc = desc_mn_major<64>(sdS, 64); // dS (= (dS^T)^T) as dQ's A; + tile steps
  const uint64_t ds_qmajor_desc = desc_k_major<64>(sdS, C::kBlockM, 0); // kDqT: dS, query-major, as dQ^T's B
  constexpr uint32_t kDsTile = desc_offset(C::kDsBytes);
  constexpr uint32_t kQStage = desc_offset(C::kQBytes);
  // This warp's first row of dS^T, and this lane's first element of its dQ part (shared addresses;
  // ds_row0 to dq_unit serve the 64- and 128-query steps, dqt_lane the 80-query ones).
  const uint32_t ds_row0 = smem_addr(sdS) + uint32_t(wg * C::kDsBytes + 16 * warp_in_wg * 128);
  // This lane's element (row 16 w + lane / 4, column c0 + 2 (lane % 4)) of its dQ part, and the
  // swizzled 16-byte unit of the n8 tile it stores q-th of each four, in the order of
  // stage_rotation (rows r and r + 8 share it): every store's address is then one of four registers
  // plus a constant.
  const int dq_c0 = C::kSplitDq ? wg * (D / 2) : 0; // a multiple of 32
  const uint32_t dq_part = smem_addr(sDq) + (C::kSplitDq ? 0u : uint32_t(wg) * C::kDqBytes);
  const uint32_t dq_lane0 =
      C::kDqByCopyEngine
          ? dq_part + uint32_t((dq_c0 / 32) * C::kBlockM * 128 + (16 * warp_in_wg + (lane >> 2)) * 128 + (lane & 1) * 8)
          : dq_part + dq_part_offset<C>(16 * warp_in_wg + (lane >> 2), dq_c0 + (lane & 3) * 2);
  const int dq_rot = stage_rotation(lane);
  uint32_t dq_unit[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) dq_unit[q] = uint32_t(stage_unit(lane, q) << 4);
  // kDqT: this lane's element e of dQ^T's n8 tile 0, (column dq_c0 + 16 w + lane / 4 + 8 (e / 2), query
  // 2 (lane % 4) + e % 2), in the part (dq_part_offset).
  uint32_t dqt_lane[4];
#pragma unroll
  for (int e = 0; e < 4; ++e)
    dqt_lane[e] = dq_part +
                  dq_part_offset<C>(2 * (lane & 3) + (e & 1), dq_c0 + 16 * warp_in_wg + (lane >> 2) + 8 * (e >> 1));

  float dk[C::kOTiles][4], dv[C::kOTiles][4];
  uint32_t step = 0, round = 0;
  Region reg;
  int32_t n0;
  for (int32_t i = 0; tile_at(i, reg, n0); ++i) {
    zero_grads<C>(dk, dv);
    // With a block list of 64-key blocks, each consumer's keys are one block of the tile.
    const int list = C::kBlockLists && a.blocks.heads > 0 && (n0 + keys0) / a.blocks.block_kv != n0 / a.blocks.block_kv ? 1 : 0;
    barrier_wait(kv_full, i & 1);
    clean_kv<C, D>(sK, sV, a, reg, n0, tid);
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
      // 2. P^T = exp2(S^T c - LSE2), 0 outside the mask; as A fragments of dV's product.
      wgmma_wait<1>();
      fence_registers(st);
      // The mask for each of the lane's two keys n (rows of S^T) as a band of query offsets: element
      // (n, m = 8 j + 2 (lane % 4) + e % 2) is visible iff -(8 j + e % 2) lies in band[e / 2].
      Band band[2];
      if (needs_mask) {
        const int32_t base = reg.diff(r0, n0 + key0); // (row r0 + m, key n0 + key0 + n): base + n - m
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int n = (lane >> 2) + 8 * h;
          const Band b = masked ? band_from(a.mask, base + n - (lane & 3) * 2) : full_band();
          band[h] = active && n0 + key0 + n < reg.col_end ? b : empty_band();
        }
      }
#pragma unroll
      for (int j = 0; j < C::kMTiles; ++j) {
        const int m = j * 8 + (lane & 3) * 2;
        const float2 l2 = *reinterpret_cast<const float2*>(&rec.lse2[m]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p = fast_exp2(fmaf(st[j][e], a.scale_log2, -((e & 1) ? l2.y : l2.x)));
          if (needs_mask) p = in_band(band[e >> 1], -(j * 8 + (e & 1))) ? p : 0.f;
          st[j][e] = p;
        }
      }
      uint32_t pa[C::kMTiles / 2][4];
#pragma unroll
      for (int kk = 0; kk < C::kMTiles / 2; ++kk) c_to_a<T>(pa[kk], st[2 * kk], st[2 * kk + 1]);

      // 3. dS^T = P^T (dP^T - delta).
      wgmma_wait<0>();
      fence_registers(dpt);
#pragma unroll
      for (int j = 0; j < C::kMTiles; ++j) {
        const float2 dl = *reinterpret_cast<const float2*>(&rec.delta[j * 8 + (lane & 3) * 2]);
#pragma unroll
        for (int e = 0; e < 4; ++e) dpt[j][e] = st[j][e] * (dpt[j][e] - ((e & 1) ? dl.y : dl.x));
      }
      uint32_t dsa[C::kMTiles / 2][4];
#pragma unroll
      for (int kk = 0; kk < C::kMTiles / 2; ++kk) c_to_a<T>(dsa[kk], dpt[2 * kk], dpt[2 * kk + 1]);

      // dV += P^T dO, dK += dS^T Q (here, or after dQ's product: kDkAfterDq).
      const auto dk_product = [&] { issue_dk_product<C, T>(dk, dsa, qb_desc, s); };
      const auto release_stage = [&] { release_q_stage<C>(dk, dsa, &q_empty[s], lane); };
      dv_dk_products<C, T>(dv, pa, dob_desc, s, dk_product); // 4.
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

      // 7. The part, times the softmax scale, to the reducer once it is done with the last parts.
      barrier_wait(dq_empty, (round & 1) ^ 1);
      if constexpr (C::kDqT) {
        // Element e of dQ^T's n8 tile j is (column dq_c0 + 16 w + lane / 4 + 8 (e / 2), query 8 j +
        // 2 (lane % 4) + e % 2): one float a store, at dqt_lane[e] plus 8 j rows (conflict-free: the
        // eight columns of a store span two 16-byte units, which the four rows' swizzles spread over
        // all 32 banks).
#pragma unroll
        for (int j = 0; j < C::kBlockM / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            st_shared_b32(dqt_lane[e] + uint32_t(j * 8 * 128), __float_as_uint(a.scale * dq[j][e]));
      } else {
        if constexpr (C::kDqByCopyEngine) rotate_tiles(dq, dq_rot); // slot j: the tile dq_unit[j % 4] holds
#pragma unroll
        for (int j = 0; j < C::kDqCols / 8; ++j)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
            st_shared_v2(dq_lane0 + (C::kDqByCopyEngine
                                         ? dq_unit[j % 4] + uint32_t((j / 4) * C::kBlockM * 128 + hh * 8 * 128)
                                         : uint32_t((8 * hh * C::kDqPitch + j * 8) * 4)),
                         a.scale * dq[j][2 * hh], a.scale * dq[j][2 * hh + 1]);
      }
      if constexpr (kTall) { // (the atomic reducer's padded rows)
#pragma unroll
        for (int j = 0; j < C::kDqCols / 8; ++j)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
            st_shared_v2(dq_lane0 + uint32_t(((64 + 8 * hh) * C::kDqPitch + j * 8) * 4), a.scale * dq_hi[j][2 * hh],
                         a.scale * dq_hi[j][2 * hh + 1]);
      }
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

    store_dkdv<C, T>(dk, dv, a, piece, kv_empty, reg, n0, key0, col0, kv_head, batch, lane);
  }
  end_reducer(dq_rec, dq_full, dq_empty, round, wg == 0 && warp_in_wg == 0 && lane == 0, lane);
#endif
}


template <class T, int D, int kBlockM>
void launch_backward_config(const BackwardParams& p, cudaStream_t stream) {
  using C = BackwardConfig<T, D, kBlockM>;
  AttnArgs a = backward_args(p);
  const bool by_pieces = share_out_pieces(p, a, stream);
  const CUtensorMapSwizzle sw = tma_swizzle(C::W);
  const CUtensorMap q_map = make_tile_map(p.q, p.dtype, p.batch, p.seqlen_q, p.heads_q, D, C::kBlockM, C::W, sw);
  const CUtensorMap do_map = make_tile_map(p.d_o, p.dtype, p.batch, p.seqlen_q, p.heads_q, D, C::kBlockM, C::W, sw);
  const CUtensorMap k_map = make_tile_map(p.k, p.dtype, p.batch, p.seqlen_kv, p.heads_kv, D, C::kBlockN, C::W, sw);
  const CUtensorMap v_map = make_tile_map(p.v, p.dtype, p.batch, p.seqlen_kv, p.heads_kv, D, C::kBlockN, C::W, sw);
  // dQ chunks added by the copy engine where the head dim and the accumulator allow it.
  const DqAdd dq_add = C::kDqByCopyEngine && tma_readable(p.dq, 4) ? DqAdd::copy_engine
                       : tma_readable(p.dq, 4)                     ? DqAdd::quads
                                                                   : DqAdd::pairs;
  CUtensorMap dq_map;
  std::memset(&dq_map, 0, sizeof dq_map);
  if (dq_add == DqAdd::copy_engine)
    dq_map = make_tile_map(p.dq, DType::fp32, p.batch, p.seqlen_q, p.heads_q, D, C::kBlockM, 32,
                           CU_TENSOR_MAP_SWIZZLE_128B);
  const auto kernel = flash_backward_sm90_kernel<T, D, kBlockM>;
  constexpr size_t smem = BackwardSmem<T, D, kBlockM>::kBytes;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  const int64_t tiles = by_pieces ? piece_tiles(p, C::kBlockN) : tile_grid(p.seqlen_kv, C::kBlockN, p.num_segments);
  const dim3 grid(unsigned(tiles), unsigned(p.heads_kv), unsigned(p.batch));
  kernel<<<grid, C::kThreads, smem, stream>>>(q_map, k_map, v_map, do_map, dq_map, a, dq_add);
  check_launch("flash backward (sm90)");
  write_split_sums(p, a, stream);
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
template <class T, int D> void launch_backward_sm90(const BackwardParams& p, cudaStream_t stream) {
  if constexpr (D == 64) {
    if (!p.blocks && p.seqlen_q >= 4096) return launch_backward_config<T, D, 128>(p, stream);
  }
  if constexpr (D == 128) {
    const bool no_window = p.mask.window_left < 0 && p.mask.window_right < 0;
    const int64_t min_rows = p.mask.causal ? 4096 : 1024;
    if (no_window && !p.blocks && p.num_segments == 0 && p.seqlen_q >= min_rows && tma_readable(p.dq, 4))
      return launch_backward_config<T, D, 80>(p, stream);
  }
  launch_backward_config<T, D, 64>(p, stream);
}

} // namespace attncore::cuda::sm90
