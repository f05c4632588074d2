// The Hopper backward's configuration, its shared-memory layout, and the named steps its kernel
// (backward_sm90.cuh) calls: the barriers' setup, the producer's copies, the consumers' products and
// their epilogue.
#pragma once

#include <cuda.h>

#include "../args.h"
#include "../device.cuh"
#include "../tiles.cuh"
#include "hopper.cuh"
#include "wgmma_ops.cuh"

namespace attncore::cuda::sm90 {

// kBlockM_: queries a step, 64; or 128 at d64, 80 at d128, in the long calls launch_backward_sm90 names.
template <class T, int D, int kBlockM_ = 64> struct BackwardConfig {
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = (kConsumers + 1) * 128;
  // Up to d128 each consumer owns 64 keys. At d256, dK and dV of 64 keys (256 registers a thread)
  // do not fit one consumer: both consumers take the same 64 keys, each holding dK and dV for half
  // the head dim; both compute the whole S^T and dP^T (7 products' work for 5), and one stage of
  // Q and dO leaves room for the dQ part.
  static constexpr bool kSharedKeys = D > 128;
  static constexpr int kBlockN = kSharedKeys ? 64 : 64 * kConsumers; // keys per CTA
  static constexpr int kBlockM = kBlockM_;                            // queries per step
  static constexpr int kStages = kSharedKeys ? 1 : 2;
  static constexpr int kKeys0 = kSharedKeys ? 0 : 64; // first key of consumer wg: kKeys0 * wg
  static constexpr int kGradCols = kSharedKeys ? D / 2 : D; // dK, dV columns of a consumer
  static constexpr int W = swizzle_cols(D);
  static constexpr int kMTiles = kBlockM / 8; // n8 tiles of S^T (its columns are queries)
  static constexpr int kOTiles = kGradCols / 8;
  static constexpr int kReducers = 3 * 32; // warps 1-3 of warpgroup 0
  static constexpr uint32_t kKVBytes = kBlockN * D * sizeof(T);  // K or V
  static constexpr uint32_t kQBytes = kBlockM * D * sizeof(T);   // Q or dO, one stage
  // dQ split by columns between the consumers where half the head dim is whole swizzle blocks
  // (d128, d256): no part to sum. At d128 each consumer's product covers all 128 keys, reading both
  // consumers' dS^T (shared, double-buffered); at d256 the keys are shared and each consumer reads
  // its own dS^T. Otherwise each consumer's product covers its own keys and the reducer sums the
  // two parts.
  static constexpr bool kSplitDq = (D / 2) % W == 0;
  static constexpr bool kDsShared = kSplitDq && !kSharedKeys; // dQ reads both consumers' dS^T
  static constexpr int kDqCols = kSplitDq ? D / 2 : D;
  static constexpr int kDsBuffers = kDsShared ? 2 : 1;
  static constexpr int kDqParts = kSplitDq ? 1 : kConsumers;
  // One consumer's dS^T, [kBlockM / 64][64 keys][64 queries]; with 80-query steps dS, [80 queries][64 keys].
  static constexpr uint32_t kDsBytes = 64 * kBlockM * sizeof(T);
  // Who adds a dQ part into the accumulator, and so its layout (dq_part_offset). The copy engine
  // at d96, d128, d256 (measured faster than vector atomics): D / 32 chunks of [kBlockM rows][32 fp32]
  // as it lays out such a box (tma_reduce_add_4d). Else the atomic reducer, on padded rows
  // (kDqPitch floats: 8 words apart, a half warp's 8-byte stores hit distinct banks), which keeps
  // its address arithmetic short: at d64 the two parts each reduced in L2 measured slower than
  // summed first (315.8 against 337-344 TFLOP/s), and d80 is not whole chunks.
  static constexpr bool kDqByCopyEngine = D % 32 == 0 && D >= 96;
  static constexpr int kDqPitch = D + 8;
  static constexpr uint32_t kDqBytes = kBlockM * (kDqByCopyEngine ? D : kDqPitch) * 4; // one part
  // dK's product after dQ's, so that dQ's part is stored while the tensor cores run dK
  // (FlashAttention-3's order): dS^T stays in registers through dQ's product, which at d256 (dQ's
  // 128 columns beside dK's and dV's) does not fit and serializes every product.
  static constexpr bool kDkAfterDq = !kSharedKeys;
  // Shared-memory bandwidth bounds a step (docs/KERNELS.md, "Shared memory bounds the backward step"). S^T = K Q^T and dP^T = V dO^T take
  // their first kKeyRegSteps / kValueRegSteps k-steps (16 columns each) of this consumer's K and V
  // from registers, A fragments loaded once a key tile, so those steps read only Q or dO there. As
  // many as fit beside dK and dV without spills and measured fastest (docs/KERNELS.md, "K and V as register operands"):
  // all of K and V at d64 and d80, one step of each at d96, two steps of K at d128 (three or more
  // spilled in the step loop; all of K serialized the products); none at d256 (two steps measured
  // no faster), nor with 128- or 80-query steps (S^T and dP^T take 128 or 80 registers; at 80 one
  // step of K spilled 28 bytes, docs/KERNELS.md, "K and V as register operands").
  static constexpr int kKeyRegSteps = kSharedKeys || kBlockM > 64 ? 0 : D <= 80 ? D / 16 : D == 96 ? 1 : 2;
  static constexpr int kValueRegSteps = kSharedKeys || kBlockM > 64 ? 0 : D <= 80 ? D / 16 : D == 96 ? 1 : 0;
  // Registers of warpgroup 0 (producer and dQ reducer) and of each consumer: 24 + 2 x 240 = 3 x 168.
  // Where the reducer adds dQ by atomics (d64, d80) it spilled at 24 and held the consumers at their
  // handoff: 40 + 2 x 232 there, +2-5% at d64 and d80 (the tall d64 steps equal; docs/KERNELS.md,
  // "The dQ reducer's registers"). At 24, two units of four floats in flight a reducer thread spilled and lost 25-30%.
  static constexpr int kProducerRegs = D <= 80 ? 40 : 24, kConsumerRegs = D <= 80 ? 232 : 240;
  static_assert(D % 16 == 0 && kGradCols <= 128, "a consumer's dK and dV (64 keys) stay in registers");
  static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0 && kDsBytes % 1024 == 0, "1024-byte tiles");
  // 80-query steps (d128, long rows without a block list: FlashAttention-3's tile for full masks).
  // dQ's 80 rows are not whole 64-row products, so dQ is made transposed, dQ^T = K^T dS^T (the
  // consumer's 64 columns by the step's 80 queries), with dS stored query-major ([80 queries][64
  // keys] for each consumer) as its K-major B operand, and the part stored transposed into the copy
  // engine's rows.
  static constexpr bool kDqT = kBlockM == 80;
  // Block lists only with 64-query steps: launch_backward_sm90 gives the 128- and 80-query steps
  // calls without one, and their walks are compiled without the block-list path.
  static constexpr bool kBlockLists = kBlockM == 64;
  static_assert(kBlockM == 64 || (kBlockM == 128 && !kSplitDq && !kDqByCopyEngine && !kSharedKeys) ||
                    (kDqT && kDsShared && kDqByCopyEngine),
                "128-query steps: each consumer's dQ part over its own keys, added by the atomic reducer; 80-query "
                "steps: dQ made transposed, split by columns, added by the copy engine");
};

// What the producer tells the consumers about a step, beside its Q and dO. head < 0: the key tile
// has no more steps.
template <int kRows> struct StepRecord {
  int32_t head, r0;
  uint32_t flags; // bit i: key block i of the tile is active; bit 2 + i: it needs element masking
  int32_t pad;
  float lse2[kRows];  // the rows' LSE in log2 units; +inf for a row without keys or past the region
  float delta[kRows]; // 0 past the region
};

// Byte offset of (row, col) in a dQ part. For the copy engine: 128-byte rows of 32 columns, 16-byte
// unit u of row r at u ^ (r % 8) (its 128-byte swizzle; the consumers store into it in the order of
// stage_rotation, or, with 80-query steps, a float at a time down the columns). Else padded rows (8
// words apart: a half warp's 8-byte stores of 4 rows land in distinct banks).
template <class C> __device__ __forceinline__ uint32_t dq_part_offset(int row, int col) {
  if constexpr (C::kDqByCopyEngine)
    return uint32_t((col / 32) * C::kBlockM * 128 + row * 128 + ((((col % 32) / 4) ^ (row & 7)) << 4) + (col % 4) * 4);
  else
    return uint32_t((row * C::kDqPitch + col) * 4);
}

// How the reducer adds the dQ parts into the fp32 accumulator: float2 or float4 atomics (by warps
// 1-3, the parts summed first), or whole chunks by the copy engine (warp 1 alone issues them).
enum class DqAdd : int { pairs, quads, copy_engine };

// What the consumers tell the reducer about a dQ part: rows [r0, r0 + rows) of query head `head`.
// head < 0: nothing more.
struct DqRecord {
  int32_t head, r0, rows, pad;
};

template <class T, int D, int kBlockM> struct BackwardSmem {
  using C = BackwardConfig<T, D, kBlockM>;
  static constexpr size_t kK = 0;
  static constexpr size_t kV = kK + C::kKVBytes;
  static constexpr size_t kQ = kV + C::kKVBytes;
  static constexpr size_t kDO = kQ + C::kStages * C::kQBytes;
  static constexpr size_t kDS = kDO + C::kStages * C::kQBytes;
  static constexpr size_t kDQ = kDS + C::kDsBuffers * C::kConsumers * C::kDsBytes;
  static constexpr size_t kSteps = kDQ + C::kDqParts * C::kDqBytes;
  static constexpr size_t kDqRec = kSteps + C::kStages * sizeof(StepRecord<kBlockM>);
  static constexpr size_t kBars = kDqRec + sizeof(DqRecord);
  static constexpr size_t kPiece = kBars + (4 + 2 * C::kStages) * sizeof(uint64_t);
  static constexpr size_t kEnd = kPiece + sizeof(TilePiece);
  static constexpr size_t kBytes = 1024 /* alignment */ + kEnd;
  static_assert(kBytes <= 227 * 1024, "must fit a Hopper CTA");
  static_assert(kDQ % 1024 == 0, "dQ parts aligned as the copy engine's 128-byte swizzle needs");
};

// The barriers, and this CTA's piece of a block list cut in pieces.
template <class C>
__device__ __forceinline__ void init_barriers(uint64_t* kv_full, uint64_t* kv_empty, uint64_t* dq_full, uint64_t* dq_empty,
                                              uint64_t* q_full, uint64_t* q_empty, TilePiece* piece, const AttnArgs& a,
                                              DqAdd dq_add) {
  barrier_init(kv_full, 1);
  barrier_init(kv_empty, C::kConsumers * 4); // one arrival per consumer warp
  barrier_init(dq_full, C::kConsumers * 4);
  barrier_init(dq_empty, dq_add == DqAdd::copy_engine ? 1 : C::kReducers / 32); // one per reducer warp
  for (int s = 0; s < C::kStages; ++s) {
    barrier_init(&q_full[s], 1);
    barrier_init(&q_empty[s], C::kConsumers * 4);
  }
  barrier_init_fence();
  if (a.blocks.pieces) *piece = tile_piece<C::kBlockN>(a.blocks.pieces, int32_t(blockIdx.x));
}

// The producer's steps (warp 0 of warpgroup 0): K and V once a key tile; per step Q and dO into a
// stage of the ring (the step's record beside them is written in the kernel).
// (Lane 0.) K and V of the key tile at n0.
template <class C, int D, class T>
__device__ __forceinline__ void load_kv(T* sK, T* sV, const CUtensorMap& k_map, const CUtensorMap& v_map,
                                        uint64_t* kv_full, int32_t n0, int kv_head, int batch) {
  constexpr int W = C::W;
  barrier_expect_bytes(kv_full, 2 * C::kKVBytes);
  for (int cb = 0; cb < D / W; ++cb) {
    tma_load_4d(sK + cb * C::kBlockN * W, &k_map, kv_full, cb * W, n0, kv_head, batch);
    tma_load_4d(sV + cb * C::kBlockN * W, &v_map, kv_full, cb * W, n0, kv_head, batch);
  }
}

// (Lane 0.) Q and dO of step q into stage s, counted by q_full's transaction bytes.
template <class C, int D, class T>
__device__ __forceinline__ void load_q_do(T* sQ, T* sdO, const CUtensorMap& q_map, const CUtensorMap& do_map,
                                          uint64_t* q_full, uint32_t s, const QStep& q, int batch) {
  constexpr int W = C::W;
  barrier_expect_tx(q_full, 2 * C::kQBytes);
  T* q_tile = sQ + s * (C::kQBytes / sizeof(T));
  T* do_tile = sdO + s * (C::kQBytes / sizeof(T));
  for (int cb = 0; cb < D / W; ++cb) {
    tma_load_4d(q_tile + cb * C::kBlockM * W, &q_map, q_full, cb * W, q.r0, q.head, batch);
    tma_load_4d(do_tile + cb * C::kBlockM * W, &do_map, q_full, cb * W, q.r0, q.head, batch);
  }
}

// The steps of a consumer warpgroup, in the kernel's order. Per key tile: zero_grads, clean_kv, K
// and V fragments; per step of queries (stage s of the ring): clean_q_do, then
//   1. scores_and_dp    S^T = K Q^T, dP^T = V dO^T, issued
//   2. (in the kernel)  P^T = exp2(S^T c - LSE2), 0 outside the mask, as A fragments pa
//   3. (in the kernel)  dS^T = P^T (dP^T - delta), as A fragments dsa
//   4. dv_dk_products   dV += P^T dO (and dK += dS^T Q where dK's product does not follow dQ's)
//   5. store_ds         dS^T (or dS) into shared memory for dQ's product
//   6. dq_product       dQ's part = dS K (or its transpose), issued
//   7. (in the kernel)  the part, times the softmax scale, to the reducer
// and at the end of the key tile store_dkdv; end_reducer once the tiles are done.
// Each step takes what it reads as arguments (arrays by reference), not through a structure of the
// consumer's state, and steps 2, 3 and 7, the producer's record and the reducer's adds stay in the
// kernel's body: the kernel is tuned to its machine code, and with a structure, or with those as
// functions, it compiled to other machine code (other registers in the producer's walk; with a
// structure, 4 to 16 more bytes of spills at d96, d128 and d256).
template <class C> using GradTiles = float[C::kOTiles][4];
template <class C> using ScoreTiles = float[C::kMTiles][4];
template <class C> using FragTiles = uint32_t[C::kMTiles / 2][4];
// Tall steps: dq for the step's first 64 queries, dq_hi for the next 64. (Apart rather than
// as one array over both: the d96-d128 kernels lost 2-4% when ptxas saw the general form.)
template <class C> constexpr bool kTallSteps = C::kBlockM == 128;
// dq: [n8 tiles of the part's columns][4]; transposed (kDqT), [n8 tiles of the step's queries][4]
// over this consumer's 64 columns.
template <class C> using DqTiles = float[C::kDqT ? C::kBlockM / 8 : C::kDqCols / 8][4];
template <class C> using DqHiTiles = float[kTallSteps<C> ? C::kDqCols / 8 : 1][4];

template <class C> __device__ __forceinline__ void zero_grads(GradTiles<C>& dk, GradTiles<C>& dv) {
#pragma unroll
  for (int j = 0; j < C::kOTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.f;
}

// Rows past a segment's end inside the tensor are zeroed before any product reads them
// (zero_rows_past): K's would reach dQ, V's dP, as 0 x NaN. Both consumers meet at barrier 3.
template <class C, int D, class T>
__device__ __forceinline__ void clean_kv(T* sK, T* sV, const AttnArgs& a, const Region& reg, int32_t n0, int tid) {
  if (warp_uniform(n0 + C::kBlockN > reg.col_end && reg.col_end < a.seqlen_kv)) {
    zero_rows_past<C::W, D, C::kBlockN>(sK, reg.col_end - n0, tid - 128, C::kConsumers * 128);
    zero_rows_past<C::W, D, C::kBlockN>(sV, reg.col_end - n0, tid - 128, C::kConsumers * 128);
    named_barrier_sync(3, C::kConsumers * 128);
  }
}

// The same for rows of Q and dO past a segment's end (Q's would make P^T 0 x NaN, dO's dP^T).
template <class C, int D, class T>
__device__ __forceinline__ void clean_q_do(T* sQ, T* sdO, const AttnArgs& a, uint32_t s, const Region& reg, int32_t r0,
                                           int tid) {
  if (warp_uniform(r0 + C::kBlockM > reg.row_end && reg.row_end < a.seqlen_q)) {
    zero_rows_past<C::W, D, C::kBlockM>(sQ + s * (C::kQBytes / sizeof(T)), reg.row_end - r0, tid - 128,
                                        C::kConsumers * 128);
    zero_rows_past<C::W, D, C::kBlockM>(sdO + s * (C::kQBytes / sizeof(T)), reg.row_end - r0, tid - 128,
                                        C::kConsumers * 128);
    named_barrier_sync(3, C::kConsumers * 128);
  }
}

// 1. S^T = K Q^T and dP^T = V dO^T for this consumer's 64 keys and the step's queries (ka, va: this
// warp's 16 keys of K and V as A fragments, kKeyRegSteps, kValueRegSteps).
template <class C, class T, int D, class KFrags, class VFrags>
__device__ __forceinline__ void scores_and_dp(ScoreTiles<C>& st, ScoreTiles<C>& dpt, const KFrags& ka, const VFrags& va,
                                              uint64_t k_desc, uint64_t v_desc, uint64_t q_desc, uint64_t do_desc,
                                              uint32_t s) {
  constexpr int W = C::W;
  constexpr uint32_t kQStage = desc_offset(C::kQBytes);
  wgmma_fence();
#pragma unroll
  for (int k0 = 0; k0 < D; k0 += 16)
    wgmma_step<T, C::kBlockM, C::kKeyRegSteps>(st, ka, k_desc + k_major_step<W>(C::kBlockN, k0),
                                               q_desc + s * kQStage + k_major_step<W>(C::kBlockM, k0), k0);
  wgmma_commit();
#pragma unroll
  for (int k0 = 0; k0 < D; k0 += 16)
    wgmma_step<T, C::kBlockM, C::kValueRegSteps>(dpt, va, v_desc + k_major_step<W>(C::kBlockN, k0),
                                                 do_desc + s * kQStage + k_major_step<W>(C::kBlockM, k0), k0);
  wgmma_commit();
}

// dK += dS^T Q, issued.
template <class C, class T>
__device__ __forceinline__ void issue_dk_product(GradTiles<C>& dk, const FragTiles<C>& dsa, uint64_t qb_desc,
                                                 uint32_t s) {
#pragma unroll
  for (int kk = 0; kk < C::kBlockM / 16; ++kk)
    Wgmma<T, C::kGradCols>::template rs<1>(
        dk, dsa[kk], qb_desc + s * desc_offset(C::kQBytes) + mn_major_step<C::W>(16 * kk), true);
}

// Q, dO and the record of a stage are free again once dK's product (the last to read Q) is back.
template <class C>
__device__ __forceinline__ void release_q_stage(GradTiles<C>& dk, FragTiles<C>& dsa, uint64_t* q_empty, int lane) {
  fence_registers(dk);
  fence_registers(dsa);
  __syncwarp();
  if (lane == 0) barrier_arrive(q_empty); // Q, dO and the record are free again
}

// 4. dV += P^T dO, dK += dS^T Q (here, or after dQ's product: kDkAfterDq).
// (dk_product: the kernel's call of issue_dk_product, as it issues dK's product after dQ's too.)
template <class C, class T, class DkProduct>
__device__ __forceinline__ void dv_dk_products(GradTiles<C>& dv, const FragTiles<C>& pa, uint64_t dob_desc, uint32_t s,
                                               const DkProduct& dk_product) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < C::kBlockM / 16; ++kk)
    Wgmma<T, C::kGradCols>::template rs<1>(
        dv, pa[kk], dob_desc + s * desc_offset(C::kQBytes) + mn_major_step<C::W>(16 * kk), true);
  if constexpr (!C::kDkAfterDq) dk_product();
  wgmma_commit();
}

// 5. dS^T (or, with 80-query steps, dS) into shared memory for dQ's product.
template <class C, class T>
__device__ __forceinline__ void store_ds(const FragTiles<C>& dsa, const T* sdS, uint32_t ds_row0, uint32_t ds_buf,
                                         int wg, int warp_in_wg, int lane) {
  if constexpr (C::kDqT) {
    // Transposed (stmatrix .trans): dS, rows the step's queries, 128-byte rows of the consumer's
    // 64 keys. Lane l addresses query row l % 8 (+ 8 for matrices 2 and 3) of matrix l / 8, whose
    // 8 keys (+ 8 for matrices 1 and 3) are one 16-byte unit; the row's swizzle is l % 8 again.
    const int mat = lane >> 3, row = lane & 7;
    const uint32_t row_addr = smem_addr(sdS) + (ds_buf * C::kConsumers + wg) * C::kDsBytes +
                              uint32_t((row + 8 * (mat >> 1)) * 128 + (((2 * warp_in_wg + (mat & 1)) ^ row) << 4));
#pragma unroll
    for (int kk = 0; kk < C::kMTiles / 2; ++kk)
      stmatrix_x4_trans(row_addr + uint32_t(kk * 16 * 128), dsa[kk]);
  } else {
    // dS^T (rows: the consumer's keys, swizzled 128-byte rows of 64 queries; a block of 64 such
    // rows for each 64 queries of the step), as dQ's A operand dS. Lane l addresses row l % 8 of
    // matrix l / 8: keys + 8 for matrices 1 and 3, queries + 8 (the next 16-byte chunk) for
    // matrices 2 and 3.
    const int mat = lane >> 3, row = lane & 7;
    const uint32_t row_addr =
        ds_row0 + ds_buf * C::kConsumers * C::kDsBytes + uint32_t((row + 8 * (mat & 1)) * 128);
#pragma unroll
    for (int kk = 0; kk < C::kMTiles / 2; ++kk)
      if constexpr (C::kBlockM == 64) // (written apart: the d96-d128 kernels lost 2-4% when ptxas saw the general form)
        stmatrix_x4(row_addr + uint32_t(((2 * kk + (mat >> 1)) ^ row) * 16), dsa[kk]);
      else
        stmatrix_x4(row_addr + uint32_t((kk / 4) * 64 * 128 + ((2 * (kk % 4) + (mat >> 1)) ^ row) * 16), dsa[kk]);
  }
  fence_async_shared();
  if constexpr (C::kDsShared) named_barrier_sync(1, 2 * 128); // both consumers' dS^T are in
  else named_barrier_sync(1 + wg, 128);
}

// 6. dQ part = dS K: over this consumer's keys, or over every key for this consumer's columns; with
// 80-query steps its transpose, for this consumer's columns. Issued.
template <class C, class T>
__device__ __forceinline__ void dq_product(DqTiles<C>& dq, DqHiTiles<C>& dq_hi, uint64_t kb_desc, uint64_t ds_desc,
                                           uint64_t ds_qmajor_desc, uint32_t ds_buf, int wg) {
  constexpr int W = C::W;
  constexpr uint32_t kDsTile = desc_offset(C::kDsBytes);
  wgmma_fence();
  if constexpr (C::kDqT) {
    // dQ^T = K^T dS^T: A is K's column block of this consumer (M-major), B the dS tiles of both
    // consumers (K-major, 64 keys each).
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk)
      Wgmma<T, C::kBlockM>::template ss<1, 0>(
          dq, kb_desc + mn_major_step<W>(16 * kk),
          ds_qmajor_desc + (ds_buf * C::kConsumers + kk / 4) * kDsTile + k_major_step<64>(C::kBlockM, 16 * (kk % 4)),
          kk > 0);
  } else if constexpr (C::kDsShared) {
#pragma unroll
    for (int kk = 0; kk < C::kBlockN / 16; ++kk)
      Wgmma<T, C::kDqCols>::template ss<1, 1>(
          dq, ds_desc + (ds_buf * C::kConsumers + kk / 4) * kDsTile + mn_major_step<64>(16 * (kk % 4)),
          kb_desc + mn_major_step<W>(16 * kk), kk > 0);
  } else {
#pragma unroll
    for (int kk = 0; kk < 64 / 16; ++kk)
      Wgmma<T, C::kDqCols>::template ss<1, 1>(dq, ds_desc + wg * kDsTile + mn_major_step<64>(16 * kk),
                                              kb_desc + mn_major_step<W>(16 * kk), kk > 0);
    if constexpr (kTallSteps<C>) {
#pragma unroll
      for (int kk = 0; kk < 64 / 16; ++kk)
        Wgmma<T, C::kDqCols>::template ss<1, 1>(
            dq_hi, ds_desc + wg * kDsTile + desc_offset(64 * 128) + mn_major_step<64>(16 * kk),
            kb_desc + mn_major_step<W>(16 * kk), kk > 0);
    }
  }
  wgmma_commit();
}

// dK (times scale) and dV into the fp32 accumulators, atomic since segments may share keys; or
// written (write_dkdv: this CTA alone makes these keys' gradients); or, for a piece of a split
// key group in such a call, added into the group's sums, which write_split_sums writes.
template <class C, class T>
__device__ __forceinline__ void store_dkdv(GradTiles<C>& dk, GradTiles<C>& dv, const AttnArgs& a,
                                           const TilePiece* piece, uint64_t* kv_empty, const Region& reg, int32_t n0,
                                           int key0, int col0, int kv_head, int batch, int lane) {
  __syncwarp();
  if (lane == 0) barrier_arrive(kv_empty); // the last product that read K and V has returned
#pragma unroll
  for (int j = 0; j < C::kOTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] *= a.scale;
  const int32_t key = n0 + key0 + (lane >> 2);
  const int col = col0 + (lane & 3) * 2;
  const int32_t slot = a.split_dk.data ? piece->slot : -1;
  if (slot >= 0) {
    const int32_t g0 = n0 / kPieceKeys * kPieceKeys;
    put_grad_tile<T>(split_slot(a.split_dk, slot, a.split_slot_stride), batch, kv_head, key - g0,
                     reg.col_end - g0, col, dk, GradOut::add_fp32);
    put_grad_tile<T>(split_slot(a.split_dv, slot, a.split_slot_stride), batch, kv_head, key - g0,
                     reg.col_end - g0, col, dv, GradOut::add_fp32);
  } else {
    put_grad_tile<T>(a.dk, batch, kv_head, key, reg.col_end, col, dk, a.dkdv_out);
    put_grad_tile<T>(a.dv, batch, kv_head, key, reg.col_end, col, dv, a.dkdv_out);
  }
}

// Tell the reducer there is nothing more, once it is done with the last parts.
__device__ __forceinline__ void end_reducer(DqRecord* dq_rec, uint64_t* dq_full, uint64_t* dq_empty, uint32_t round,
                                            bool writer, int lane) {
  barrier_wait(dq_empty, (round & 1) ^ 1);
  if (writer) dq_rec->head = -1;
  __syncwarp();
  if (lane == 0) barrier_arrive(dq_full);
}

} // namespace attncore::cuda::sm90
