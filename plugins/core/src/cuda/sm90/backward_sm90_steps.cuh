// The Hopper backward's configuration, its shared-memory layout, and the named steps its kernel
// (backward_sm90.cuh) calls: the barriers' setup, the key tiles' walk, the producer, the dQ
// reducer's adds, the consumers' products, their softmax gradient and their epilogue.
#pragma once

#include <cuda.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "../args.h"
#include "../cta_order.h"
#include "../device.cuh"
#include "../fp8_inputs.h"
#include "../tiles.cuh"
#include "../../workspace_bytes.h"
#include "fp8_operands.cuh"
#include "hopper.cuh"
#include "wgmma_ops.cuh"

namespace attncore::cuda::sm90 {

// kBlockM_: queries a step, 64; or 128 at d64, 80 at d128, in the long calls launch_backward_sm90 names.
// kFp8_: an FP8 call's backward with three of its products in e4m3 (kFp8 below).
template <class T, int D, int kBlockM_ = 64, bool kFp8_ = false> struct BackwardConfig {
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
  // dV's product issued before dS^T's arithmetic, which waits for dP^T alone, where dK's product
  // follows dQ's (so that dV's is the only one issued there). With FP8 products only (-1.0% bwd at
  // B=4 H=32 S=16384 full); the bf16 kernels spilled more so (docs/KERNELS.md, "dV's product under
  // dS^T's arithmetic").
  static constexpr bool kDvUnderDs = kDkAfterDq && kFp8_;
  // Shared-memory bandwidth bounds a step (docs/KERNELS.md, "Shared memory bounds the backward step"). S^T = K Q^T and dP^T = V dO^T take
  // their first kKeyRegSteps / kValueRegSteps k-steps (16 columns each) of this consumer's K and V
  // from registers, A fragments loaded once a key tile, so those steps read only Q or dO there. As
  // many as fit beside dK and dV without spills and measured fastest (docs/KERNELS.md, "K and V as register operands"):
  // all of K and V at d64 and d80, one step of each at d96, two steps of K at d128 (three or more
  // spilled in the step loop; all of K serialized the products); none at d256 (two steps measured
  // no faster), nor with 128- or 80-query steps (S^T and dP^T take 128 or 80 registers; at 80 one
  // step of K spilled 28 bytes, docs/KERNELS.md, "K and V as register operands").
  // With FP8 products (k-steps of 32 e4m3 elements) none: two k-steps of K8, or one of K8 and one of
  // V8, compiled without spills and measured level with none (69.2-69.9 against 68.9 ms full at the
  // reference shape); three or more spilled.
  static constexpr int kKeyRegSteps = kSharedKeys || kBlockM > 64 || kFp8_ ? 0 : D <= 80 ? D / 16 : D == 96 ? 1 : 2;
  static constexpr int kValueRegSteps = kSharedKeys || kBlockM > 64 || kFp8_ ? 0 : D <= 80 ? D / 16 : D == 96 ? 1 : 0;
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
  // FP8 products (an FP8 call with e4m3 dO, BackwardFp8Maps). The e4m3 operands are read K-major
  // only, so three of the five products take them as they lie: S^T = K Q^T and dP^T = V dO^T read
  // Q, K, V and dO as given, and dV += P^T dO reads dO^T (queries contiguous, in v_key_at order
  // within each 32-query group, so that P^T packs from the score registers as the FP8 forward's P
  // does). dK += dS^T Q and dQ = dS K stay bf16 products, on Q widened once per call and K widened
  // from K8 a key tile (widen_k_block), with dS in bf16. Shared memory: K8 and V8 take V's region
  // (V itself is read by no bf16 product), each stage's dO8 and dO^T take dO's, and Q8 has a region
  // of its own.
  static constexpr bool kFp8 = kFp8_;
  static constexpr int W8 = swizzle_cols(D / 2);          // Q8's, K8's, V8's and dO8's rows, in 16-bit columns
  static constexpr int WT = swizzle_cols(kBlockM / 2);    // dO^T's rows (a step's queries)
  static constexpr uint32_t kKV8Bytes = kBlockN * D;     // K8 or V8
  static constexpr uint32_t kQ8Bytes = kBlockM * D;      // Q8, dO8 or dO^T, one stage
  static_assert(!kFp8 || (kBlockM == 64 && D == 128 && !kSharedKeys && std::is_same_v<T, __nv_bfloat16>),
                "FP8 products: d128, 64-query steps (a step's queries are whole 32-query k-steps of dV's product), "
                "bf16 for the rest");
  static_assert(!kFp8 || (2 * kKV8Bytes == kKVBytes && 2 * kQ8Bytes == kQBytes), "K8, V8 in V's place; dO8, dO^T in dO's");
  static_assert(!kFp8 || (kKeyRegSteps == 0 && kValueRegSteps == 0), "FP8 products read K8 and V8 from shared memory");
  // With FP8 products dQ's part is stored by stmatrix, four floats a lane an instruction, no selects
  // (docs/KERNELS.md, "dQ parts by stmatrix"): K's widening interleaves its columns within each
  // eight (widen_k_block), so that a lane's two floats of an n8 tile are columns c and c + 4,
  // which stmatrix's 16-bit matrices then place in their natural order.
  static constexpr bool kDqByStmatrix = kFp8;
  // The softmax scale folded into dS^T (scale dP^T - scale delta, the producer's record holding delta
  // times the scale): dQ's part goes to shared memory and dK to its store without a multiply
  // (docs/KERNELS.md, "The softmax scale in dS^T at d128": level in bf16, -1.5% with FP8 products).
  static constexpr bool kScaleInDs = D == 128;
  // dQ rounded into BackwardParams::dq_out by each query head's last CTA (AttnArgs::dq_done), not by
  // a pass after the call: with FP8 products only. FP8 bwd write at B=4 H=32 S=16384 full, 65.15 /
  // 64.66 ms against 65.62 / 65.06 with the pass; bf16 d128 was slower so, 42.18 / 80.07 against
  // 41.73 / 78.61 ms causal / full (docs/KERNELS.md, "dQ rounded by the last CTA of a head").
  static constexpr bool kDqOutInKernel = kFp8_;
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
// last: at the CTA's end, with dQ written rounded (AttnArgs::dq_done), the reducer's word to the
// consumers that this CTA's adds were the last into its query head.
struct DqRecord {
  int32_t head, r0, rows, last;
};

template <class T, int D, int kBlockM, bool kFp8 = false> struct BackwardSmem {
  using C = BackwardConfig<T, D, kBlockM, kFp8>;
  static constexpr size_t kK = 0;
  static constexpr size_t kV = kK + C::kKVBytes;
  static constexpr size_t kQ = kV + C::kKVBytes;
  static constexpr size_t kDO = kQ + C::kStages * C::kQBytes;
  static constexpr size_t kQ8 = kDO + C::kStages * C::kQBytes;  // FP8 products: Q8, kStages tiles
  static constexpr size_t kDS = kQ8 + (C::kFp8 ? C::kStages * C::kQ8Bytes : 0);
  static constexpr size_t kDQ = kDS + C::kDsBuffers * C::kConsumers * C::kDsBytes;
  static constexpr size_t kSteps = kDQ + C::kDqParts * C::kDqBytes;
  static constexpr size_t kDqRec = kSteps + C::kStages * sizeof(StepRecord<kBlockM>);
  static constexpr size_t kBars = kDqRec + sizeof(DqRecord);
  static constexpr size_t kPiece = kBars + (4 + 2 * C::kStages) * sizeof(uint64_t);
  static constexpr size_t kEnd = kPiece + sizeof(TilePiece);
  static constexpr size_t kBytes = 1024 /* alignment */ + kEnd;
  static_assert(kBytes <= 227 * 1024, "must fit a Hopper CTA");
  static_assert(kDQ % 1024 == 0, "dQ parts aligned as the copy engine's 128-byte swizzle needs");

  // The regions and barriers of a CTA's shared memory (smem: its 1024-byte aligned start).
  struct Regions {
    T *k, *v, *q, *d_o; // Q and dO: kStages tiles each
    // [buffer][consumer]: [64 keys][kBlockM queries] tiles; with 80-query steps [80 queries][64 keys]
    T* ds;
    float* dq;
    StepRecord<kBlockM>* steps;
    DqRecord* dq_rec;
    // With a block list cut in pieces, this CTA's piece, in shared memory: held in registers by
    // every role, or loaded where each role needs it, it spilled the producer (24 registers) at d128.
    // And the CTA's place (cta_place): its first key, its run of query heads and its kv head.
    TilePiece* piece;
    uint64_t *kv_full, *kv_empty, *dq_full, *dq_empty, *q_full, *q_empty; // q_*: kStages each
    uint8_t* q8; // FP8 products: Q as given, kStages tiles
  };
  __device__ static Regions regions(unsigned char* smem) {
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kBars);
    return Regions{reinterpret_cast<T*>(smem + kK),
                   reinterpret_cast<T*>(smem + kV),
                   reinterpret_cast<T*>(smem + kQ),
                   reinterpret_cast<T*>(smem + kDO),
                   reinterpret_cast<T*>(smem + kDS),
                   reinterpret_cast<float*>(smem + kDQ),
                   reinterpret_cast<StepRecord<kBlockM>*>(smem + kSteps),
                   reinterpret_cast<DqRecord*>(smem + kDqRec),
                   reinterpret_cast<TilePiece*>(smem + kPiece),
                   bars,
                   bars + 1,
                   bars + 2,
                   bars + 3,
                   bars + 4,
                   bars + 4 + C::kStages,
                   smem + kQ8};
  }
};

// The CTA's key tile and run of query heads (the kv head's group / head_splits heads): blockIdx.x
// and blockIdx.y, or, in a causal plain call (tile_groups), the launch order read as groups of runs
// whose key tiles go heaviest first, the group's runs side by side. In head order each head's
// heaviest tile (every row) starts only after the heads before it, the last ones in the grid's last
// wave; so ordered, every group's heavy tiles start before its light ones, and the light ones fill
// the end, while a group of runs keeps the heads whose Q, dO and dQ are in flight as few as in head
// order (docs/KERNELS.md, "Heaviest key tiles first").
__device__ __forceinline__ CtaPlace cta_place(const AttnArgs& a) {
  if (a.tile_groups == 0) return {int32_t(blockIdx.x), int32_t(blockIdx.y)};
  const int32_t launch = int32_t(blockIdx.y) * int32_t(gridDim.x) + int32_t(blockIdx.x);
  return place_in_groups(launch, int32_t(gridDim.x), int32_t(gridDim.y), a.tile_groups);
}

// The barriers, this CTA's piece of a block list cut in pieces, and its place (cta_place).
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
  if (a.tail.parts > 1) { // a one-dimensional grid, its last CTAs the tail's parts
    const TailPlace t = place_with_tail(blockIdx.x, a.tail);
    *piece = TilePiece{t.tile * C::kBlockN, -1, t.run, t.run / a.head_splits, t.batch, t.part, t.slot};
    return;
  }
  if (a.blocks.pieces) *piece = tile_piece<C::kBlockN>(a.blocks.pieces, int32_t(blockIdx.x));
  const CtaPlace place = cta_place(a);
  if (a.tile_groups) piece->n0 = place.tile * C::kBlockN;
  piece->run = place.run;
  piece->kv_head = place.run / a.head_splits;
  piece->tail = -1;  // (the batch is blockIdx.z)
}

// The key tiles of this CTA, in the same order for every role: one (the i == 0 call), or a stride
// over segments. False past the last.
template <class C>
__device__ __forceinline__ bool key_tile(const AttnArgs& a, const TilePiece* piece, int32_t i, Region& reg, int32_t& n0) {
  const int32_t x = int32_t(blockIdx.x) + i * int32_t(gridDim.x);
  if (a.nseg == 0) {
    reg = whole_call(a.mask, a.seqlen_q, a.seqlen_kv);
    n0 = a.blocks.pieces || a.tile_groups || a.tail.parts > 1 ? piece->n0 : x * C::kBlockN;
    return i == 0 && n0 < a.seqlen_kv;
  }
  int32_t seg, tile;
  if (!locate_tile(a.segs, a.nseg, x, C::kBlockN, false, seg, tile)) return false;
  reg = segment_region(a.segs[seg]);
  n0 = reg.col_begin + tile * C::kBlockN;
  return true;
}

// The e4m3 operands of a backward with FP8 products (BackwardConfig::kFp8), beside the kernel's
// bf16 Q (widened) and its v_map and do_map (then V and dO as given): Q and K as given, and dO^T
// ([batch][head][dim][queries rounded to 32], transpose_v_fp8's layout); and K's descale, for the
// consumers' widening of K (widen_k_block). Zeros elsewhere.
struct BackwardFp8Maps {
  CUtensorMap q8, k8, dot;
  float descale_k;
};

// With FP8 products each key row of P^T rounds to e4m3 times a power of two of its own (scale_p_rows),
// kept as a float's biased exponent (2^(x - 127)), so that every rescale is exact. A row that has
// seen no P yet holds the largest, 2^100.
using PRowScales = uint32_t[2]; // this lane's two key rows of the warp's 16 (g and g + 8)
constexpr uint32_t kPRowScaleMax = 127 + 100;

// The producer's steps (warp 0 of warpgroup 0): K and V once a key tile; per step Q and dO into a
// stage of the ring, and the step's record beside them (produce_steps).
// (Lane 0.) K and V of the key tile at n0 (FP8 products: K8 and V8 in V's place, K's bf16 copy
// made from K8 by the consumers, widen_k_block).
template <class C, int D, class T>
__device__ __forceinline__ void load_kv(T* sK, T* sV, const CUtensorMap& k_map, const CUtensorMap& v_map,
                                        const BackwardFp8Maps& f8, uint64_t* kv_full, int32_t n0, int kv_head,
                                        int batch) {
  constexpr int W = C::W;
  if constexpr (C::kFp8) {
    uint8_t* k8 = reinterpret_cast<uint8_t*>(sV);
    barrier_expect_bytes(kv_full, 2 * C::kKV8Bytes);
    tma_load_4d(k8, &f8.k8, kv_full, 0, n0, kv_head, batch);
    tma_load_4d(k8 + C::kKV8Bytes, &v_map, kv_full, 0, n0, kv_head, batch);
  } else {
    barrier_expect_bytes(kv_full, 2 * C::kKVBytes);
    for (int cb = 0; cb < D / W; ++cb) {
      tma_load_4d(sK + cb * C::kBlockN * W, &k_map, kv_full, cb * W, n0, kv_head, batch);
      tma_load_4d(sV + cb * C::kBlockN * W, &v_map, kv_full, cb * W, n0, kv_head, batch);
    }
  }
}

// (Lane 0.) Q and dO of step q into stage s, counted by q_full's transaction bytes.
// FP8 products: Q, and Q8, dO8 and dO^T (dO8 and dO^T in dO's place).
template <class C, int D, class T>
__device__ __forceinline__ void load_q_do(T* sQ, T* sdO, uint8_t* sQ8, const CUtensorMap& q_map,
                                          const CUtensorMap& do_map, const BackwardFp8Maps& f8, uint64_t* q_full,
                                          uint32_t s, const QStep& q, int batch) {
  constexpr int W = C::W;
  T* q_tile = sQ + s * (C::kQBytes / sizeof(T));
  T* do_tile = sdO + s * (C::kQBytes / sizeof(T));
  barrier_expect_tx(q_full, C::kFp8 ? C::kQBytes + 3 * C::kQ8Bytes : 2 * C::kQBytes);
  for (int cb = 0; cb < D / W; ++cb) {
    tma_load_4d(q_tile + cb * C::kBlockM * W, &q_map, q_full, cb * W, q.r0, q.head, batch);
    if constexpr (!C::kFp8) tma_load_4d(do_tile + cb * C::kBlockM * W, &do_map, q_full, cb * W, q.r0, q.head, batch);
  }
  if constexpr (C::kFp8) {
    uint8_t* do8 = reinterpret_cast<uint8_t*>(do_tile);
    tma_load_4d(sQ8 + s * C::kQ8Bytes, &f8.q8, q_full, 0, q.r0, q.head, batch);
    tma_load_4d(do8, &do_map, q_full, 0, q.r0, q.head, batch);
    tma_load_4d(do8 + C::kQ8Bytes, &f8.dot, q_full, q.r0, 0, q.head, batch);
  }
}

// The producer (warp 0 of warpgroup 0): per key tile of the CTA, K and V, then per step of its
// walk Q and dO into a stage of the ring and the step's record beside them; a record with head < 0
// ends the tile. It takes the shared memory's start, not the kernel's pointers into it, and writes
// the record here rather than in a function of its own: with either of those its 24 registers at
// d256 spilled 8 more bytes of stores and 12 of loads (BackwardConfig::kProducerRegs).
template <class C, int D, class T>
__device__ __forceinline__ void produce_steps(unsigned char* smem, const CUtensorMap& k_map, const CUtensorMap& v_map,
                                              const CUtensorMap& q_map, const CUtensorMap& do_map,
                                              const BackwardFp8Maps& f8, const AttnArgs& a, int batch, int lane) {
  using L = BackwardSmem<T, D, C::kBlockM, C::kFp8>;
  using Record = StepRecord<C::kBlockM>;
  T* sK = reinterpret_cast<T*>(smem + L::kK);
  T* sV = reinterpret_cast<T*>(smem + L::kV);
  T* sQ = reinterpret_cast<T*>(smem + L::kQ);
  T* sdO = reinterpret_cast<T*>(smem + L::kDO);
  uint8_t* sQ8 = smem + L::kQ8;
  Record* steps = reinterpret_cast<Record*>(smem + L::kSteps);
  const TilePiece* piece = reinterpret_cast<const TilePiece*>(smem + L::kPiece);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* kv_full = bars;
  uint64_t* kv_empty = bars + 1;
  uint64_t* q_full = bars + 4;
  uint64_t* q_empty = q_full + C::kStages;
  uint32_t step = 0;
  Region reg;
  int32_t n0;
  for (int32_t i = 0; key_tile<C>(a, piece, i, reg, n0); ++i) {
    barrier_wait(kv_empty, (i & 1) ^ 1);
    if (lane == 0) load_kv<C, D>(sK, sV, k_map, v_map, f8, kv_full, n0, piece->kv_head, batch);
    QWalk<C::kBlockM, C::kBlockN> walk;
    const BlockArgs no_list{};
    const BlockArgs& blocks = C::kBlockLists ? a.blocks : no_list;
    const int32_t heads = a.group / a.head_splits;  // this CTA's query heads: its run of them
    walk.init(a.mask, reg, blocks, piece->run * heads, heads, n0);
    if (piece->tail >= 0) walk.keep_part(piece->part, a.tail.parts);
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
      if (lane == 0) load_q_do<C, D>(sQ, sdO, sQ8, q_map, do_map, f8, &q_full[s], s, q, batch);
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
        rec.delta[lane + 32 * h] = C::kScaleInDs ? delta * a.scale : delta;
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
}

// The dQ reducer's adds of one part (rec: its rows and query head) into the fp32 dQ accumulator
// (rt: this thread's index among the reducer's).
template <class C, int D>
__device__ __forceinline__ void add_dq_part(const DqRecord& rec, const AttnArgs& a, const CUtensorMap& dq_map,
                                           DqAdd dq_add, const float* sDq, int batch, int rt, int lane) {
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
    // Thread rt takes the float4 units rt, rt + kReducers, ... of the part's rows, its (row, unit)
    // stepped rather than divided out of the index: the division's chain of integer ops stood before
    // each unit's loads, and the consumers waited for the reducer (docs/KERNELS.md, "The dQ
    // reducer's loop").
    constexpr int kUnits = D / 4; // float4 units a row
    constexpr int kRowStep = C::kReducers / kUnits, kUnitStep = C::kReducers % kUnits;
    const unsigned char* parts = reinterpret_cast<const unsigned char*>(sDq);
    float* const dq_rows = dq + int64_t(rec.r0) * a.dq.token_stride;
    for (int row = rt / kUnits, unit = rt % kUnits; row < rec.rows;) {
      const int col = unit * 4;
      float4 x = *reinterpret_cast<const float4*>(parts + dq_part_offset<C>(row, col));
      if constexpr (C::kDqParts == 2) {
        const float4 y = *reinterpret_cast<const float4*>(parts + C::kDqBytes + dq_part_offset<C>(row, col));
        x = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
      }
      float* dst = dq_rows + int64_t(row) * a.dq.token_stride + col;
      row += kRowStep;
      if constexpr (kUnitStep != 0) {
        unit += kUnitStep;
        if (unit >= kUnits) {
          unit -= kUnits;
          ++row;
        }
      }
      if (dq_add == DqAdd::quads) {
        atomicAdd(reinterpret_cast<float4*>(dst), x);
      } else {
        atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x.x, x.y));
        atomicAdd(reinterpret_cast<float2*>(dst + 2), make_float2(x.z, x.w));
      }
    }
  }
}

// The steps of a consumer warpgroup, in the kernel's order. Once: operand_descriptors,
// dq_part_addresses; per key tile: zero_grads, clean_kv, K and V fragments; per step of queries
// (stage s of the ring): clean_q_do, then
//   1. scores_and_dp    S^T = K Q^T, dP^T = V dO^T, issued
//   2. probabilities    P^T = exp2(S^T c - LSE2), 0 outside the mask, as A fragments pa
//   2'. scale_p_rows    (FP8 products) P^T in e4m3, a scale a key row, as A fragments pa
//   3. score_grads      dS^T = P^T (dP^T - delta), as A fragments dsa
//   4. dv_dk_products   dV += P^T dO (and dK += dS^T Q where dK's product does not follow dQ's);
//                       with FP8 products issued before 3 (kDvUnderDs)
//   5. store_ds         dS^T (or dS) into shared memory for dQ's product
//   6. dq_product       dQ's part = dS K (or its transpose), issued
//   7. store_dq_part    the part (times the softmax scale, unless dS^T holds it) into shared memory
// and at the end of the key tile store_dkdv (FP8 products: after unscale_dv_rows); end_reducer once
// the tiles are done.
// Each step takes what it reads as arguments (arrays by reference), not through a structure of the
// consumer's state: with a structure the kernel spilled 4 to 16 more bytes at d96, d128 and d256.
// The producer and the reducer share warpgroup 0's 24 registers a thread (40 at d64 and d80), and
// their spills there move with how the whole kernel is cut into functions, even where a cut is
// far from their code. The cuts here keep every instantiation's registers, spill bytes and stack
// frame at those of the kernel in one piece (the machine code differs in register choice and
// order, the instruction count by at most 0.2%). Cuts that spilled more, so kept out: step 7's
// handshake (the wait for the reducer, the DqRecord, the arrive) in a function with its stores, 4
// more bytes of spill stores and 8 of loads at d96; the reducer's round loop as a function, 8 more
// bytes of spill loads at d96; the producer's, as produce_steps notes.
template <class C> using GradTiles = float[C::kOTiles][4];
template <class C> using ScoreTiles = float[C::kMTiles][4];
template <class C> using FragTiles = uint32_t[C::kMTiles / 2][4];
// P^T as dV's A fragments: bf16 k-steps of 16 queries, or e4m3 ones of 32 (FP8 products).
template <class C> using PFrags = uint32_t[C::kFp8 ? C::kMTiles / 4 : C::kMTiles / 2][4];
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
  if constexpr (C::kFp8) return; // (plain calls only: no segment ends inside the tensor)
  if (warp_uniform(n0 + C::kBlockN > reg.col_end && reg.col_end < a.seqlen_kv)) {
    zero_rows_past<C::W, D, C::kBlockN>(sK, reg.col_end - n0, tid - 128, C::kConsumers * 128);
    zero_rows_past<C::W, D, C::kBlockN>(sV, reg.col_end - n0, tid - 128, C::kConsumers * 128);
    named_barrier_sync(3, C::kConsumers * 128);
  }
}

// FP8 products: K's bf16 copy for dQ's product, widened from K8 (times K's descale, columns in
// interleaved_column's order) by the consumer that reads it: each consumer's dQ columns are one
// W-column block of sK over every key of the tile (kSplitDq), so a thread widens its key row's
// four 16-byte units of K8 there. A pass over the whole of K before the call cost 0.25 ms at
// B=4 H=32 S=16384 (docs/KERNELS.md, "K widened in the kernel"). The first step's store_ds fences
// the stores for the async proxy and meets both consumers at a barrier before any dQ product reads
// them; the last tile's dQ products are done (each step waits for its products).
template <class C, class T>
__device__ __forceinline__ void widen_k_block(T* sK, const T* sV, float descale_k, int wg, int tid_in_wg) {
  static_assert(C::kFp8 && C::kSplitDq && !C::kSharedKeys && C::kDqCols == C::W && C::kBlockN == 128,
                "a consumer's dQ columns: one block of sK, a key row a thread");
  const int row = tid_in_wg;
  const unsigned char* k8 = reinterpret_cast<const unsigned char*>(sV) + row * 128;  // 128 e4m3 a row
  unsigned char* kb = reinterpret_cast<unsigned char*>(sK + wg * C::kBlockN * C::W) + row * 128;  // 64 bf16 a row
#pragma unroll
  for (int h = 0; h < 4; ++h) {  // K8's unit 4 wg + h: columns 64 wg + 16 h .. + 15, 128-byte swizzled rows
    const uint4 raw = *reinterpret_cast<const uint4*>(k8 + (((4 * wg + h) ^ (row & 7)) << 4));
    uint4 out[2];
    widen_fp8_unit<true>(raw, true, descale_k, out);
    *reinterpret_cast<uint4*>(kb + (((2 * h) ^ (row & 7)) << 4)) = out[0];
    *reinterpret_cast<uint4*>(kb + (((2 * h + 1) ^ (row & 7)) << 4)) = out[1];
  }
}

// The same for rows of Q and dO past a segment's end (Q's would make P^T 0 x NaN, dO's dP^T).
template <class C, int D, class T>
__device__ __forceinline__ void clean_q_do(T* sQ, T* sdO, const AttnArgs& a, uint32_t s, const Region& reg, int32_t r0,
                                           int tid) {
  if constexpr (C::kFp8) return; // (plain calls only)
  if (warp_uniform(r0 + C::kBlockM > reg.row_end && reg.row_end < a.seqlen_q)) {
    zero_rows_past<C::W, D, C::kBlockM>(sQ + s * (C::kQBytes / sizeof(T)), reg.row_end - r0, tid - 128,
                                        C::kConsumers * 128);
    zero_rows_past<C::W, D, C::kBlockM>(sdO + s * (C::kQBytes / sizeof(T)), reg.row_end - r0, tid - 128,
                                        C::kConsumers * 128);
    named_barrier_sync(3, C::kConsumers * 128);
  }
}

// A consumer's shared-memory operands as wgmma descriptors (stage 0; the steps add the stage's and
// the k-step's offsets). The kernel takes the structure apart where it gets it (structured
// bindings): its code is then that of the descriptors made one by one in the kernel.
struct OperandDescriptors {
  uint64_t k, v;      // K and V as the A of S^T and dP^T: this consumer's keys
  uint64_t kb;        // K as dQ's B: this consumer's keys (dQ by keys), or every key and this consumer's columns
  uint64_t q, d_o;    // Q and dO as the B of S^T and dP^T
  uint64_t qb, dob;   // Q and dO as the B of dK and dV: this consumer's columns
  uint64_t ds;        // dS (= (dS^T)^T) as dQ's A; + tile steps
  uint64_t ds_qmajor; // kDqT: dS, query-major, as dQ^T's B
};
template <class C, int D, class T>
__device__ __forceinline__ OperandDescriptors operand_descriptors(const T* sK, const T* sV, const T* sQ, const T* sdO,
                                                                  const uint8_t* sQ8, const T* sdS, int wg, int keys0,
                                                                  int col0) {
  constexpr int W = C::W;
  // The consumer's half of an MN-major tile of `rows` rows (d256), as a descriptor offset.
  const auto half_of = [&](int rows) { return desc_offset(uint32_t((col0 / W) * rows * W * 2)); };
  OperandDescriptors d{
      desc_k_major<W>(sK, C::kBlockN, keys0),
      desc_k_major<W>(sV, C::kBlockN, keys0),
      desc_mn_major<W>(sK, C::kBlockN) + (C::kSplitDq ? desc_offset(uint32_t(wg * (D / 2 / W) * C::kBlockN * W * 2))
                                                      : mn_major_step<W>(keys0)),
      desc_k_major<W>(sQ, C::kBlockM, 0),
      desc_k_major<W>(sdO, C::kBlockM, 0),
      desc_mn_major<W>(sQ, C::kBlockM) + half_of(C::kBlockM),
      desc_mn_major<W>(sdO, C::kBlockM) + half_of(C::kBlockM),
      desc_mn_major<64>(sdS, 64),
      desc_k_major<64>(sdS, C::kBlockM, 0)};
  if constexpr (C::kFp8) { // K8, V8 in V's place; dO8, dO^T in dO's (in the 16-bit vocabulary: W8 columns a row)
    const uint8_t* k8 = reinterpret_cast<const uint8_t*>(sV);
    const uint8_t* do8 = reinterpret_cast<const uint8_t*>(sdO);
    d.k = desc_k_major<C::W8>(k8, C::kBlockN, keys0);
    d.v = desc_k_major<C::W8>(k8 + C::kKV8Bytes, C::kBlockN, keys0);
    d.q = desc_k_major<C::W8>(sQ8, C::kBlockM, 0);
    d.d_o = desc_k_major<C::W8>(do8, C::kBlockM, 0);
    d.dob = desc_k_major<C::WT>(do8 + C::kQ8Bytes, D, 0);
  }
  return d;
}

// kDqByStmatrix: float e of lane l's n8 tile j, (row l / 4 + 8 (e / 2), K's column 8 j + 2 (l % 4) + e % 2
// of the interleaved widening), lies where stmatrix puts it, byte 4 (l % 4) of the 16-byte unit
// 2 (j % 4) + e % 2 of the row that lane 8 e + l / 4 addresses (dq_part_addresses): the unit that
// holds that column of the part, and each matrix's eight units cover all 32 banks.
constexpr bool stmatrix_dq_order_is_natural() {
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 8; ++j)
      for (int e = 0; e < 4; ++e) {
        const int row = lane / 4 + 8 * (e / 2), col = interleaved_column(8 * j + 2 * (lane % 4) + e % 2);
        const int addresser = 8 * e + lane / 4; // its matrix e, row lane / 4
        const int addressed_row = 8 * (addresser / 8 / 2) + addresser % 8;
        const int unit = 2 * (j % 4) + (addresser / 8) % 2;
        if (addressed_row != row || 32 * (j / 4) + 4 * unit + lane % 4 != col) return false;
      }
  for (int m = 0; m < 4; ++m)
    for (int t = 0; t < 4; ++t) {
      bool taken[8] = {};
      for (int i = 0; i < 8; ++i) {
        const int slot = (2 * t + m % 2) ^ i; // row 8 (m / 2) + i of the warp's 16: i = row % 8
        if (taken[slot]) return false;
        taken[slot] = true;
      }
    }
  return true;
}
static_assert(stmatrix_dq_order_is_natural(), "dQ's part by stmatrix: natural columns, one wavefront a matrix");

// This lane's shared addresses in its dQ part: dq_lane0, dq_unit and dq_rot serve the stores of
// 64- and 128-query steps, dqt_lane those of 80-query steps.
template <class C, int D>
__device__ __forceinline__ void dq_part_addresses(uint32_t& dq_lane0, uint32_t (&dq_unit)[4], uint32_t (&dqt_lane)[4],
                                                  int& dq_rot, const float* sDq, int wg, int warp_in_wg, int lane) {
  // This lane's element (row 16 w + lane / 4, column c0 + 2 (lane % 4)) of its dQ part, and the
  // swizzled 16-byte unit of the n8 tile it stores q-th of each four, in the order of
  // stage_rotation (rows r and r + 8 share it): every store's address is then one of four registers
  // plus a constant.
  const int dq_c0 = C::kSplitDq ? wg * (D / 2) : 0; // a multiple of 32
  const uint32_t dq_part = smem_addr(sDq) + (C::kSplitDq ? 0u : uint32_t(wg) * C::kDqBytes);
  dq_lane0 =
      C::kDqByCopyEngine
          ? dq_part + uint32_t((dq_c0 / 32) * C::kBlockM * 128 + (16 * warp_in_wg + (lane >> 2)) * 128 + (lane & 1) * 8)
          : dq_part + dq_part_offset<C>(16 * warp_in_wg + (lane >> 2), dq_c0 + (lane & 3) * 2);
  dq_rot = stage_rotation(lane);
#pragma unroll
  for (int q = 0; q < 4; ++q) dq_unit[q] = uint32_t(stage_unit(lane, q) << 4);
  if constexpr (C::kDqByStmatrix) { // (in place of the rotated order's: an if-else compiled differently, untimed)
    // Lanes 8m .. 8m + 7 give the rows of matrix m: floats e = m of the n8 tile, rows 16 w + 8 (m / 2)
    // + lane % 8, 16-byte unit 2 (j % 4) + m % 2 of tile j's 32-column chunk.
    const int m = lane >> 3, row = 16 * warp_in_wg + 8 * (m >> 1) + (lane & 7);
    dq_lane0 = dq_part + uint32_t((dq_c0 / 32) * C::kBlockM * 128 + row * 128);
#pragma unroll
    for (int t = 0; t < 4; ++t) dq_unit[t] = uint32_t(((2 * t + (m & 1)) ^ (lane & 7)) << 4);
  }
  // kDqT: this lane's element e of dQ^T's n8 tile 0, (column dq_c0 + 16 w + lane / 4 + 8 (e / 2), query
  // 2 (lane % 4) + e % 2), in the part (dq_part_offset).
#pragma unroll
  for (int e = 0; e < 4; ++e)
    dqt_lane[e] = dq_part +
                  dq_part_offset<C>(2 * (lane & 3) + (e & 1), dq_c0 + 16 * warp_in_wg + (lane >> 2) + 8 * (e >> 1));
}

// 1. S^T = K Q^T and dP^T = V dO^T for this consumer's 64 keys and the step's queries (ka, va: this
// warp's 16 keys of K and V as A fragments, kKeyRegSteps, kValueRegSteps).
template <class C, class T, int D, class KFrags, class VFrags>
__device__ __forceinline__ void scores_and_dp(ScoreTiles<C>& st, ScoreTiles<C>& dpt, const KFrags& ka, const VFrags& va,
                                              uint64_t k_desc, uint64_t v_desc, uint64_t q_desc, uint64_t do_desc,
                                              uint32_t s) {
  // With FP8 products the operands are e4m3 (a k-step of 16 16-bit columns is 32 elements), Q8 a tile
  // of its own a stage and dO8 in dO's stage.
  using E = std::conditional_t<C::kFp8, __nv_fp8_e4m3, T>;
  constexpr int W = C::kFp8 ? C::W8 : C::W;
  constexpr int kCols = C::kFp8 ? D / 2 : D; // a row, in 16-bit columns
  constexpr uint32_t kQStage = desc_offset(C::kFp8 ? C::kQ8Bytes : C::kQBytes), kDoStage = desc_offset(C::kQBytes);
  wgmma_fence();
#pragma unroll
  for (int k0 = 0; k0 < kCols; k0 += 16)
    wgmma_step<E, C::kBlockM, C::kKeyRegSteps>(st, ka, k_desc + k_major_step<W>(C::kBlockN, k0),
                                               q_desc + s * kQStage + k_major_step<W>(C::kBlockM, k0), k0);
  wgmma_commit();
#pragma unroll
  for (int k0 = 0; k0 < kCols; k0 += 16)
    wgmma_step<E, C::kBlockM, C::kValueRegSteps>(dpt, va, v_desc + k_major_step<W>(C::kBlockN, k0),
                                                 do_desc + s * kDoStage + k_major_step<W>(C::kBlockM, k0), k0);
  wgmma_commit();
}

// 2. P^T = exp2(S^T c - LSE2), 0 outside the mask; as A fragments pa of dV's product, and in st
// (fp32) for dS^T. lse2: the step's StepRecord::lse2 (+inf for a row without keys, so that a masked
// score, -inf, gives 0 there too).
//
// The mask for each of the lane's two keys n (rows of S^T) as a band of query offsets: element
// (n, m = 8 j + 2 (lane % 4) + e % 2) is visible iff -(8 j + e % 2) lies in band[e / 2].
template <class C>
__device__ __forceinline__ void mask_bands(Band (&band)[2], const AttnArgs& a, const Region& reg, bool active,
                                           bool masked, int32_t r0, int32_t n0, int key0, int lane) {
  const int32_t base = reg.diff(r0, n0 + key0); // (row r0 + m, key n0 + key0 + n): base + n - m
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = (lane >> 2) + 8 * h;
    const Band b = masked ? band_from(a.mask, base + n - (lane & 3) * 2) : full_band();
    band[h] = active && n0 + key0 + n < reg.col_end ? b : empty_band();
  }
}

template <class C, class T>
__device__ __forceinline__ void probabilities(PFrags<C>& pa, ScoreTiles<C>& st, const AttnArgs& a, const float* lse2,
                                              const Region& reg, bool needs_mask, bool active, bool masked, int32_t r0,
                                              int32_t n0, int key0, int lane) {
  wgmma_wait<1>();
  fence_registers(st);
  // The mask sets the scores outside it to -inf first, behind the warp-uniform needs_mask, as the
  // forward's does: as a select beside each exponential it was if-converted, and its three compares
  // and the select ran on every step. Not in the 80-query steps at d128, whose registers have no room
  // for the branch: ptxas serializes their products there (docs/KERNELS.md, "The backward's mask
  // behind a branch").
  constexpr bool kSelect = C::kDqT;
  Band band[2];
  if (needs_mask) {
    mask_bands<C>(band, a, reg, active, masked, r0, n0, key0, lane);
    if constexpr (!kSelect) {
#pragma unroll
      for (int j = 0; j < C::kMTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!in_band(band[e >> 1], -(j * 8 + (e & 1)))) st[j][e] = -INFINITY;
    }
  }
#pragma unroll
  for (int j = 0; j < C::kMTiles; ++j) {
    const int m = j * 8 + (lane & 3) * 2;
    const float2 l2 = *reinterpret_cast<const float2*>(&lse2[m]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float p = fast_exp2(fmaf(st[j][e], a.scale_log2, -((e & 1) ? l2.y : l2.x)));
      if constexpr (kSelect)
        if (needs_mask) p = in_band(band[e >> 1], -(j * 8 + (e & 1))) ? p : 0.f;
      st[j][e] = p;
    }
  }
  if constexpr (!C::kFp8) { // (FP8 products: scale_p_rows packs them)
#pragma unroll
    for (int kk = 0; kk < C::kMTiles / 2; ++kk) c_to_a<T>(pa[kk], st[2 * kk], st[2 * kk + 1]);
  }
}

// 2'. With FP8 products: P^T (pt, fp32) as e4m3 A fragments pa, each key row times a power of two of
// its own. P is normalized (about 1 / keys): with one scale for every row it fell into e4m3's
// subnormals as rows grew, and dV's error with it (docs/KERNELS.md, "FP8 backward"). A row's scale
// is set where its values would saturate (the key tile's first step, or a later, larger P): the
// largest that puts the row's greatest P in [8, 16), that row of dV rescaled first, as the online
// softmax rescales O; unscale_dv_rows takes it out at the end of the key tile. The headroom (a row's
// P may grow 28x before it saturates) keeps those steps rare; the others only look at the packed bytes.
template <class C>
__device__ __forceinline__ void scale_p_rows(PFrags<C>& pa, GradTiles<C>& dv, PRowScales& rows, const ScoreTiles<C>& pt) {
  float scale[2] = {__uint_as_float(rows[0] << 23), __uint_as_float(rows[1] << 23)};
  pack_e4m3_fragments(pa, pt, scale);
  // A byte of 0x7e (448, where satfinite stops) or more carries into its top bit with 2 added (P is
  // not negative: bytes up to 0x7f, so no carry crosses into the next byte).
  uint32_t carry = 0;
#pragma unroll
  for (int kk = 0; kk < C::kMTiles / 4; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) carry |= pa[kk][i] + 0x02020202u;
  if (!__any_sync(~0u, carry & 0x80808080u)) return;

  float top[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < C::kMTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) top[e >> 1] = fmaxf(top[e >> 1], pt[j][e]);
  float factor[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    top[h] = fmaxf(top[h], __shfl_xor_sync(~0u, top[h], 1)); // a key row lies across the lane's quad
    top[h] = fmaxf(top[h], __shfl_xor_sync(~0u, top[h], 2));
    // top in [2^(x - 127), 2^(x - 126)) (x its biased exponent, 0 for a row of zeros): times
    // 2^(130 - x), whose biased exponent is 257 - x, it lies in [8, 16). (P <= 1 gives x <= 127;
    // the clamp at 134 keeps next >= 123, so that the factor's exponent below cannot wrap.)
    const uint32_t x = min(__float_as_uint(top[h]) >> 23, 134u);
    const uint32_t next = min(rows[h], min(257u - x, kPRowScaleMax));
    factor[h] = __uint_as_float((next + 127u - rows[h]) << 23); // 2^(next - rows): 1, or down to 2^-104
    scale[h] = __uint_as_float(next << 23);
    rows[h] = next;
  }
#pragma unroll
  for (int j = 0; j < C::kOTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dv[j][e] *= factor[e >> 1];
  pack_e4m3_fragments(pa, pt, scale); // (dO^T's queries in v_key_at order)
}

// dV's rows without their P scales (scale_p_rows), at the end of a key tile.
template <class C> __device__ __forceinline__ void unscale_dv_rows(GradTiles<C>& dv, const PRowScales& rows) {
  const float inverse[2] = {__uint_as_float((254u - rows[0]) << 23), __uint_as_float((254u - rows[1]) << 23)};
#pragma unroll
  for (int j = 0; j < C::kOTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dv[j][e] *= inverse[e >> 1];
}

// 3. dS^T = P^T (dP^T - delta) (pt: P^T in fp32; delta: the step's StepRecord::delta), as A
// fragments dsa. (FP8 products and kScaleInDs: dP^T times dp_scale first.)
template <class C, class T>
__device__ __forceinline__ void score_grads(FragTiles<C>& dsa, ScoreTiles<C>& dpt, const ScoreTiles<C>& pt,
                                            const float* delta, float dp_scale, int lane) {
  wgmma_wait<C::kDvUnderDs ? 1 : 0>(); // dP^T (dV's product, issued after it, may run on)
  fence_registers(dpt);
#pragma unroll
  for (int j = 0; j < C::kMTiles; ++j) {
    const float2 dl = *reinterpret_cast<const float2*>(&delta[j * 8 + (lane & 3) * 2]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float dp = C::kFp8 || C::kScaleInDs ? dpt[j][e] * dp_scale : dpt[j][e];
      dpt[j][e] = pt[j][e] * (dp - ((e & 1) ? dl.y : dl.x));
    }
  }
#pragma unroll
  for (int kk = 0; kk < C::kMTiles / 2; ++kk) c_to_a<T>(dsa[kk], dpt[2 * kk], dpt[2 * kk + 1]);
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
// (FP8 products: dV's is e4m3, over dO^T in dO's place, k-steps of 32 queries.)
template <class C, class T, class DkProduct>
__device__ __forceinline__ void dv_dk_products(GradTiles<C>& dv, const PFrags<C>& pa, uint64_t dob_desc, uint32_t s,
                                               const DkProduct& dk_product) {
  wgmma_fence();
  if constexpr (C::kFp8) {
#pragma unroll
    for (int kk = 0; kk < C::kBlockM / 32; ++kk)
      Wgmma<__nv_fp8_e4m3, C::kGradCols>::template rs<0>(
          dv, pa[kk], dob_desc + s * desc_offset(C::kQBytes) + k_major_step<C::WT>(C::kGradCols, 16 * kk), true);
  } else {
#pragma unroll
    for (int kk = 0; kk < C::kBlockM / 16; ++kk)
      Wgmma<T, C::kGradCols>::template rs<1>(
          dv, pa[kk], dob_desc + s * desc_offset(C::kQBytes) + mn_major_step<C::W>(16 * kk), true);
  }
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

// 7. The part, times `scale`, into shared memory for the reducer (the kernel waits for
// the reducer to be done with the last parts first). dq_lane0, dq_unit, dq_rot, dqt_lane: this
// lane's addresses (dq_part_addresses); rotate_tiles reorders dq.
template <class C>
__device__ __forceinline__ void store_dq_part(DqTiles<C>& dq, DqHiTiles<C>& dq_hi, float scale, uint32_t dq_lane0,
                                              const uint32_t (&dq_unit)[4], const uint32_t (&dqt_lane)[4], int dq_rot) {
  if constexpr (C::kDqT) {
    // Element e of dQ^T's n8 tile j is (column dq_c0 + 16 w + lane / 4 + 8 (e / 2), query 8 j +
    // 2 (lane % 4) + e % 2): one float a store, at dqt_lane[e] plus 8 j rows (conflict-free: the
    // eight columns of a store span two 16-byte units, which the four rows' swizzles spread over
    // all 32 banks).
#pragma unroll
    for (int j = 0; j < C::kBlockM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        st_shared_b32(dqt_lane[e] + uint32_t(j * 8 * 128), __float_as_uint(scale * dq[j][e]));
  } else if constexpr (C::kDqByStmatrix) {
    // Tile j's four floats are matrices 0-3 of one stmatrix (dq_part_addresses): eight rows of 16 bytes
    // each, whose swizzled units cover all 32 banks.
#pragma unroll
    for (int j = 0; j < C::kDqCols / 8; ++j) {
      const uint32_t r[4] = {__float_as_uint(scale * dq[j][0]), __float_as_uint(scale * dq[j][1]),
                             __float_as_uint(scale * dq[j][2]), __float_as_uint(scale * dq[j][3])};
      stmatrix_x4(dq_lane0 + dq_unit[j % 4] + uint32_t((j / 4) * C::kBlockM * 128), r);
    }
  } else {
    if constexpr (C::kDqByCopyEngine) rotate_tiles(dq, dq_rot); // slot j: the tile dq_unit[j % 4] holds
#pragma unroll
    for (int j = 0; j < C::kDqCols / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        st_shared_v2(dq_lane0 + (C::kDqByCopyEngine
                                     ? dq_unit[j % 4] + uint32_t((j / 4) * C::kBlockM * 128 + hh * 8 * 128)
                                     : uint32_t((8 * hh * C::kDqPitch + j * 8) * 4)),
                     scale * dq[j][2 * hh], scale * dq[j][2 * hh + 1]);
  }
  if constexpr (kTallSteps<C>) { // (the atomic reducer's padded rows)
#pragma unroll
    for (int j = 0; j < C::kDqCols / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        st_shared_v2(dq_lane0 + uint32_t(((64 + 8 * hh) * C::kDqPitch + j * 8) * 4), scale * dq_hi[j][2 * hh],
                     scale * dq_hi[j][2 * hh + 1]);
  }
}

// The last wave in parts (AttnArgs::tail): this warp's dK and dV fragments added into its slot of
// the tail tile's sums, [warp][float4 of the lane][lane], then counted in; true for the warp that
// counts last, its fragments then the sums of every part's (read at L2, where the adds landed). Each
// lane's fence orders its adds before lane 0's count (release), and the count before the reads.
template <class C>
__device__ __forceinline__ bool sum_tail_parts(GradTiles<C>& dk, GradTiles<C>& dv, const AttnArgs& a, int32_t tile,
                                               int warp, int lane) {
  static_assert(C::kConsumers * 4 <= int(kTailWarps) && 2 * C::kOTiles * 4 <= 128, "a slot's warps and floats");
  float4* sums = reinterpret_cast<float4*>(a.tail_sums) + (int64_t(tile) * kTailWarps + warp) * 32 * 32 + lane;
#pragma unroll
  for (int j = 0; j < C::kOTiles; ++j) {
    atomicAdd(sums + 32 * j, make_float4(dk[j][0], dk[j][1], dk[j][2], dk[j][3]));
    atomicAdd(sums + 32 * (C::kOTiles + j), make_float4(dv[j][0], dv[j][1], dv[j][2], dv[j][3]));
  }
  __threadfence();
  __syncwarp();
  int32_t before = 0;
  if (lane == 0) before = atomicAdd(a.tail_done + tile * int32_t(kTailWarps) + warp, 1);
  if (__shfl_sync(0xffffffffu, before, 0) != a.tail.parts - 1) return false;
  __threadfence();
#pragma unroll
  for (int j = 0; j < C::kOTiles; ++j) {
    const float4 k = __ldcg(sums + 32 * j), v = __ldcg(sums + 32 * (C::kOTiles + j));
    dk[j][0] = k.x, dk[j][1] = k.y, dk[j][2] = k.z, dk[j][3] = k.w;
    dv[j][0] = v.x, dv[j][1] = v.y, dv[j][2] = v.z, dv[j][3] = v.w;
  }
  return true;
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
    for (int e = 0; e < 4; ++e) {
      if constexpr (!C::kScaleInDs) dk[j][e] *= a.scale;
      if constexpr (C::kFp8) dv[j][e] *= a.dv_scale;
    }
  if (piece->tail >= 0 && !sum_tail_parts<C>(dk, dv, a, piece->tail, warp_uniform(int(threadIdx.x / 32)) - 4, lane))
    return; // another part writes the tile
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
    add_grad_tile(a.dk_add, batch, kv_head, key, a.add_begin, a.add_end, col, dk);
    add_grad_tile(a.dv_add, batch, kv_head, key, a.add_begin, a.add_end, col, dv);
    put_grad_tile<T>(a.dk, batch, kv_head, key, reg.col_end, col, dk, a.dkdv_out);
    put_grad_tile<T>(a.dv, batch, kv_head, key, reg.col_end, col, dv, a.dkdv_out);
  }
}

// dQ written rounded (AttnArgs::dq_done). (The reducer's lane 0, after its last adds were issued.)
// Once the CTA's adds into its query head are in, it counts in; the count says whether it was the
// last of the head's CTAs (gridDim.x, or ctas_of_line's with the last wave in parts), for the
// consumers (dq_rec->last). The adds are in where their bulk group completes; the fence then orders
// them, and every earlier CTA's through its count, before this one (release and acquire at the device's scope: the consumers read dQ after it).
__device__ __forceinline__ void count_dq_adds(const AttnArgs& a, DqRecord* dq_rec, int batch, int head) {
  bulk_wait_all();
  asm volatile("fence.proxy.async.global;\n" ::: "memory"); // (the copy engine's writes, for generic reads)
  __threadfence();
  const int64_t line = int64_t(batch) * a.heads_q + head;
  const int32_t before = atomicAdd(a.dq_done + line, 1);
  __threadfence();
  dq_rec->last = before == (a.tail.parts > 1 ? ctas_of_line(line, a.tail) : int32_t(gridDim.x)) - 1;
}

// The last CTA's rounding of its query head's dQ (all seqlen_q rows) from the fp32 accumulator into
// dq_out, by the consumers' threads (t of kConsumers x 128), a float4 a thread a row unit, four in
// flight; read at L2 (.cg), where the head's adds landed, past this SM's L1.
template <class C, int D, class T>
__device__ __forceinline__ void write_dq_out(const AttnArgs& a, int batch, int head, int t) {
  constexpr int kUnits = D / 4, kThreads = C::kConsumers * 128, kInFlight = 4;
  const float* dq = static_cast<const float*>(a.dq.data) + batch * a.dq.batch_stride + head * a.dq.head_stride;
  T* out = static_cast<T*>(a.dq_out.data) + batch * a.dq_out.batch_stride + head * a.dq_out.head_stride;
  const int64_t units = int64_t(a.seqlen_q) * kUnits;
  for (int64_t u0 = t; u0 < units; u0 += kInFlight * kThreads) {
    float4 x[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int64_t u = u0 + k * kThreads, row = u / kUnits;
      if (u < units) x[k] = __ldcg(reinterpret_cast<const float4*>(dq + row * a.dq.token_stride + (u % kUnits) * 4));
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int64_t u = u0 + k * kThreads, row = u / kUnits;
      if (u < units) {
        *reinterpret_cast<uint2*>(out + row * a.dq_out.token_stride + (u % kUnits) * 4) =
            make_uint2(pack2<T>(x[k].x, x[k].y), pack2<T>(x[k].z, x[k].w));
      }
    }
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
