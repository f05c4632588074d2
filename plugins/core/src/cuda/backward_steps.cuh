// The mma.sync backward's shapes and steps, which backward.cuh composes into its kernels: the tile
// shapes (BackwardConfig, DqConfig), the warp's products, and each kernel's steps as functions
// named for what they compute, inlined into the kernel.
#pragma once

#include <cuda.h>

#include <type_traits>

#include "args.h"
#include "device.cuh"
#include "tiles.cuh"
#if ATTNCORE_HAVE_SM90
#include "sm90/hopper.cuh"
#endif

namespace attncore::cuda {

// kMTiles key m16 tiles a warp: 2 (128 keys a CTA) up to D = 128; 1 (64 keys) at D = 256, for the
// registers of dK and dV, and at D = 80-128 where the device's shared memory is too small for 128.
// kBlockM queries a step: 64, or 128 at D = 64 (launch_backward says where).
template <class T, int D, int kMTiles_, int kBlockM_ = 64> struct BackwardConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kWarpN = 16 * kMTiles;
  static constexpr int kBlockN = 4 * kWarpN; // keys per CTA: 128, or 64
  static constexpr int kBlockM = kBlockM_;   // queries per step
  static constexpr int kWarpM = kBlockM / 2; // queries of a warp's S^T and dP^T
  static constexpr int kQTiles = kWarpM / 8; // their n8 tiles
  using Tile = HeadTile<T, D>;                  // K, V, Q, dO (smem_tile.h)
  using PTile = SmemTile<T, kBlockM, false>;    // P^T, dS^T: written a word at a time, padded
  // The products with D-wide outputs (dV, dK, dQ) split the head dim between kColSplit warps: two
  // halves, or four quarters at D = 256, where halves would give a warp 16 keys x 128 columns, each
  // B fragment feeding two products (quarters: 32 x 64, +4-5%, docs/KERNELS.md, "Tiles per head dim").
  static constexpr int kColSplit = D == 256 ? 4 : 2;
  static constexpr int kGradKeys = kBlockN * kColSplit / kWarps; // keys of a warp's dK and dV
  static constexpr int kGradMTiles = kGradKeys / 16;
  static constexpr int kOutCols = D / kColSplit; // columns of a warp's dK, dV, dQ
  static constexpr int kOutTiles = kOutCols / 8;
  // dQ's own split of the head dim: quarters at D = 128, so that a warp's dQ is 32 rows x 32
  // columns (FlashAttention-2's tile there), each K fragment feeding two products.
  static constexpr int kDqColSplit = D == 128 ? 4 : kColSplit;
  static constexpr int kDqCols = D / kDqColSplit, kDqTiles = kDqCols / 8;
  static constexpr int kDqRows = kBlockM * kDqColSplit / kWarps; // rows of a warp's dQ
  // Whether dS carries the softmax scale to dK and dQ (store_ds says why).
  static constexpr bool kScaleInDs = D == 64 || D == 128;
  // Shared memory, in bytes: K, V, P^T, dS^T, then the stages, each Q, dO and their rows' LSE and
  // delta, so that a stage is one base plus constants. Q/dO are double-buffered where the device's
  // shared memory allows.
  static constexpr uint32_t kKVBytes = Tile::bytes(kBlockN);
  static constexpr uint32_t kPBytes = PTile::bytes(kBlockN);
  static constexpr uint32_t kQBytes = Tile::bytes(kBlockM);
  static constexpr uint32_t kV = kKVBytes, kP = 2 * kKVBytes, kDs = kP + kPBytes, kStage0 = kDs + kPBytes;
  static constexpr uint32_t kDo = kQBytes, kLse = 2 * kQBytes, kDelta = kLse + kBlockM * sizeof(float); // in a stage
  static constexpr uint32_t kStageBytes = kDelta + kBlockM * sizeof(float);
  static constexpr size_t smem_bytes(int stages) { return kSmemAlign + kStage0 + size_t(stages) * kStageBytes; }
  static_assert(kKVBytes % 128 == 0 && kPBytes % 128 == 0 && kStageBytes % 128 == 0, "tiles on 128-byte lines");
  static_assert(D % 16 == 0, "head dim must be a multiple of 16");
  static_assert(kMTiles == 1 || kMTiles == 2, "one or two key tiles a warp");
  static_assert(kBlockM == 64 || kBlockM == 128, "steps of 64 or 128 queries");
  static_assert(2 * kBlockM <= kThreads, "a thread a row statistic");
  static_assert(kGradKeys % 16 == 0 && kDqRows % 16 == 0 && kOutCols % 8 == 0, "whole m16 and n8 tiles");
  static_assert(smem_bytes(2) <= 227 * 1024, "two stages must fit an sm_90 CTA");
  // dQ by the copy engine (sm_90a, two stages): where a warp's dQ is one group of rows (all but
  // D = 256, whose boxes would not fit), the warp stores it into a box of its own after the stages,
  // and one bulk reduce adds the box into the fp32 accumulator in L2, in place of kDqRows x kDqCols
  // / 64 vector atomics a thread, whose late operand reads held the step (ncu). Rows of
  // 32 columns (128 bytes, D = 64 and 128) are stored in the copy engine's 128-byte swizzle, which
  // a half warp's 8-byte stores of four rows hit without a bank conflict; rows of 40 or 48 columns
  // (D = 80, 96) are plain, 8 or 16 words apart.
  static constexpr int kDqGroup = D == 256 ? 1 : kDqRows / 16; // dQ's m16 tiles made together
  static constexpr bool kDqBoxes = kDqGroup * 16 == kDqRows && kDqCols * 4 % 16 == 0;
  static constexpr bool kDqSwizzled = kDqCols == 32;
  static constexpr uint32_t kDqBoxBytes = kDqRows * kDqCols * sizeof(float);
  static constexpr uint32_t kDqBox0 = kStage0 + 2 * kStageBytes; // then rounded up to 1024 bytes
  static constexpr size_t smem_bytes_dq_boxes() { return smem_bytes(2) + 1024 + kWarps * kDqBoxBytes; }
  static_assert(!kDqSwizzled || kDqBoxBytes % 1024 == 0, "swizzled boxes on 1024-byte lines");
  static_assert(kDqBoxBytes % 128 == 0, "boxes on 128-byte lines");
};

// out[mt][j] += a[mt] B for every n8 tile j, B the 16 x (8 kNT) block at rows k0.. of a k-major tile
// (Tile) whose fragment (0, 0) this lane reads at `b` (lane_kn): each B fragment feeds every m16
// tile. from_zero: out = a B instead.
template <class T, class Tile, int kMT, int kNT>
__device__ __forceinline__ void mma_k_step(float (&out)[kMT][kNT][4], const uint32_t (&a)[kMT][4], uint32_t b_frag,
                                           int k0, bool from_zero = false) {
#pragma unroll
  for (int j = 0; j < kNT; j += 2) {
    if (j + 1 < kNT) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, Tile::at(b_frag, k0, j * 8));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mma_16x8x16<T>(out[mt][j], a[mt], b[0], b[1], from_zero);
        mma_16x8x16<T>(out[mt][j + 1], a[mt], b[2], b[3], from_zero);
      }
    } else { // an odd count of n-tiles (D = 80)
      uint32_t b[2];
      ldmatrix_x2_trans(b, Tile::at(b_frag, k0, j * 8));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) mma_16x8x16<T>(out[mt][j], a[mt], b[0], b[1], from_zero);
    }
  }
}

#if ATTNCORE_SM90_DEVICE
// A warp's dQ (scaled) into its box (BackwardConfig::kDqBoxes), then added by the copy engine into
// the accumulator at column col0, row row0 of the map's (head, batch). The caller has waited until
// the copy engine read what the warp handed it a step ago. Rows past the tensor are dropped; rows
// past a segment add their dQ, exactly 0 (their dO, delta and so dS are 0).
template <class C>
__device__ __forceinline__ void add_dq_box(const float (&dq)[C::kDqGroup][C::kDqTiles][4], unsigned char* box,
                                           const CUtensorMap* map, int col0, int row0, int head, int batch, int lane) {
  // The lane's rows are lane / 4 + 8 h: in the swizzle, row % 8 is lane / 4 for all of them, and n8
  // tile j's chunks are those of tile 0 XOR 2 j, so one offset a lane serves every store.
  const uint32_t lane_off = sm90::swizzled_offset<64>(lane >> 2, (lane & 3) >> 1) + (lane & 1) * 8;
#pragma unroll
  for (int mt = 0; mt < C::kDqGroup; ++mt)
#pragma unroll
    for (int j = 0; j < C::kDqTiles; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = 16 * mt + 8 * hh; // of the lane's group of 8
        const uint32_t at = C::kDqSwizzled ? row * 128 + (lane_off ^ (32 * j))
                                           : uint32_t(((row + (lane >> 2)) * C::kDqCols + 8 * j + (lane & 3) * 2) * 4);
        sm90::st_shared_v2(smem_addr(box) + at, dq[mt][j][2 * hh], dq[mt][j][2 * hh + 1]);
      }
  // Sent at once: after dK's product, the fence (which waits until the stores are done) held each
  // warp before the step's barrier: 3-7% slower (docs/KERNELS.md, "mma.sync experiments not kept").
  sm90::fence_async_shared();
  __syncwarp();
  if (lane == 0) {
    sm90::tma_reduce_add_4d(map, box, col0, row0, head, batch);
    sm90::bulk_commit();
  }
}
#endif

struct NoOp {
  __device__ void operator()(int) const {}
};

// out[mt][j] += A (kGradMTiles x 16 rows over the step's queries, of P^T or dS^T, read at a_frag:
// lane_a) times B (the step's queries x this warp's kOutCols columns of dO or Q, at b_frag:
// lane_kn): dV or dK. after(i) runs after the i-th k-step (dQ's atomics, spread over dK's product).
template <class T, int D, int kMTiles, int kBlockM, class C = BackwardConfig<T, D, kMTiles, kBlockM>, class After = NoOp>
__device__ __forceinline__ void accumulate_grad(float (&out)[C::kGradMTiles][C::kOutTiles][4], uint32_t a_frag,
                                                uint32_t b_frag, After after = {}) {
#pragma unroll
  for (int k0 = 0; k0 < C::kBlockM; k0 += 16) {
    uint32_t a[C::kGradMTiles][4];
#pragma unroll
    for (int mt = 0; mt < C::kGradMTiles; ++mt) ldmatrix_x4(a[mt], C::PTile::at(a_frag, 16 * mt, k0));
    mma_k_step<T, typename C::Tile>(out, a, b_frag, k0);
    after(k0 / 16);
  }
}

// ---- dK/dV: the steps of dkdv_tile -------------------------------------------------------------

// dQ by the copy engine (where dkdv_tile is given a dq_map) is compiled in the sm_90a code only.
template <class C> __device__ constexpr bool dq_box_code() {
#if ATTNCORE_SM90_DEVICE
  return C::kDqBoxes;
#else
  return false;
#endif
}

// The warp's slices of dV, dK (kWarps / kColSplit slices of keys by kColSplit of columns: keys
// grow0.., columns col0..) and dQ (slices of rows by kDqColSplit of columns: rows qrow0.., columns
// dq_col0..). Where kColSplit = 2, (ws, wc) is the (wr, wh) of S^T and dP^T.
template <class C>
__device__ __forceinline__ void grad_slices(const int& warp, int& grow0, int& qrow0, int& col0, int& dq_col0) {
  constexpr int kSlices = C::kWarps / C::kColSplit;
  const int ws = warp & (kSlices - 1), wc = warp >> (kSlices == 4 ? 2 : 1);
  constexpr int kDqSlices = C::kWarps / C::kDqColSplit;
  // Where dQ splits as dK and dV do, its indices are theirs (ws, col0), not the same values written
  // in dQ's own form: that form changed the other head dims' code and cost d96 3.5% (docs/KERNELS.md,
  // "Tiles per head dim").
  constexpr bool kDqOwnSplit = C::kDqColSplit != C::kColSplit;
  grow0 = ws * C::kGradKeys;
  qrow0 = (kDqOwnSplit ? warp & (kDqSlices - 1) : ws) * C::kDqRows;
  col0 = wc * C::kOutCols;
  dq_col0 = kDqOwnSplit ? (warp / kDqSlices) * C::kDqCols : col0;
}

// This lane's fragment addresses (smem_tile.h) for the warp's slices of the tile.
template <class C>
__device__ __forceinline__ void lane_fragments(unsigned char* const& smem, const int& lane, const int& wh,
                                               const int& wrow0, const int& grow0, const int& qrow0, const int& col0,
                                               const int& dq_col0, uint32_t& k_rows, uint32_t& q_cols, uint32_t& p_rows,
                                               uint32_t& do_cols, uint32_t& ds_rows, uint32_t& k_cols) {
  using Tile = typename C::Tile;
  using PTile = typename C::PTile;
  const uint32_t s0 = smem_addr(smem);
  k_rows = s0 + Tile::bytes(wrow0) + Tile::lane_a(lane); // S^T's A: K (V: + kV)
  q_cols = s0 + C::kStage0 + Tile::bytes(C::kWarpM * wh) + Tile::lane_nk(lane); // S^T's B: Q (dP^T's: dO, + kDo)
  p_rows = s0 + C::kP + PTile::bytes(grow0) + PTile::lane_a(lane); // dV's A: P^T (dK's: dS^T, + kPBytes)
  // dV's B: dO (dK's: Q, - kDo); dQ's B: K; both from the warp's first column.
  do_cols = Tile::template at_cols<C::kOutCols>(s0 + C::kStage0 + C::kDo + Tile::lane_kn(lane), col0);
  ds_rows = s0 + C::kDs + PTile::offset(0, qrow0) + PTile::lane_nk(lane); // dQ's A: dS = (dS^T)^T
  k_cols = Tile::template at_cols<C::kDqCols>(s0 + Tile::lane_kn(lane), dq_col0);
}

// K and V of the key tile from n0 into shared memory.
template <class T, class C>
__device__ __forceinline__ void load_kv_tile(const AttnArgs& a, T* sK, T* sV, const Region& reg, int32_t n0,
                                             int kv_head, int batch, int tid) {
  using Tile = typename C::Tile;
  const T* k = static_cast<const T*>(a.k.data) + batch * a.k.batch_stride + kv_head * a.k.head_stride;
  const T* v = static_cast<const T*>(a.v.data) + batch * a.v.batch_stride + kv_head * a.v.head_stride;
  load_tile_async<C::kBlockN, Tile, C::kThreads>(sK, k + int64_t(n0) * a.k.token_stride, a.k.token_stride,
                                                 reg.col_end - n0, tid);
  load_tile_async<C::kBlockN, Tile, C::kThreads>(sV, v + int64_t(n0) * a.v.token_stride, a.v.token_stride,
                                                 reg.col_end - n0, tid);
}

// Q, dO, and the rows' statistics of step s into stage st. Rows past the region get LSE = +inf
// (so P = 0) and delta = 0: they add nothing, whatever their Q.
template <class T, class C>
__device__ __forceinline__ void load_step(const AttnArgs& a, unsigned char* const& stage0, const Region& reg,
                                          const int& batch, const int& tid, int st, const QStep& s) {
  using Tile = typename C::Tile;
  const int64_t qoff = batch * a.q.batch_stride + s.head * a.q.head_stride + int64_t(s.r0) * a.q.token_stride;
  const int64_t ooff = batch * a.d_o.batch_stride + s.head * a.d_o.head_stride + int64_t(s.r0) * a.d_o.token_stride;
  unsigned char* buf = stage0 + st * C::kStageBytes;
  load_tile_async<C::kBlockM, Tile, C::kThreads>(reinterpret_cast<T*>(buf), static_cast<const T*>(a.q.data) + qoff,
                                                 a.q.token_stride, reg.row_end - s.r0, tid);
  load_tile_async<C::kBlockM, Tile, C::kThreads>(reinterpret_cast<T*>(buf + C::kDo),
                                                 static_cast<const T*>(a.d_o.data) + ooff, a.d_o.token_stride,
                                                 reg.row_end - s.r0, tid);
  // The rows' LSE and delta come by copies too: loaded and stored by threads, the loads' latency
  // held every warp at the next barrier (ncu). Past the region they are zero, which
  // adds nothing: there Q and dO are zero, so P = 1 but dP = 0, dS = 0 and P^T dO = 0.
  if (tid < 2 * C::kBlockM) {
    const int row = tid % C::kBlockM;
    const bool ok = s.r0 + row < reg.row_end;
    const float* src = tid < C::kBlockM ? a.lse.data + batch * a.lse.batch_stride + s.head * a.lse.head_stride
                                        : a.delta.data + batch * a.delta.batch_stride + s.head * a.delta.head_stride;
    float* dst = reinterpret_cast<float*>(buf + (tid < C::kBlockM ? C::kLse : C::kDelta)) + row;
    cp_async_4(dst, ok ? src + s.r0 + row : src, ok);
  }
}

// The next step's copies, where there is a next step, as one commit group (empty where there is not).
template <class T, class C>
__device__ __forceinline__ void load_next_step(const AttnArgs& a, unsigned char* const& stage0, const Region& reg,
                                               const int& batch, const int& tid, int st, bool have_next,
                                               const QStep& nxt) {
  if (have_next) load_step<T, C>(a, stage0, reg, batch, tid, st, nxt);
  cp_async_commit();
}

// Waits until the copy engine has read the warp's dQ box (its last bulk reduce), where it has one.
template <bool kDqBoxCode> __device__ __forceinline__ void wait_dq_box_read(const CUtensorMap* const& dq_map) {
#if ATTNCORE_SM90_DEVICE
  if (kDqBoxCode && dq_map) sm90::bulk_wait_read();
#endif
}

// One barrier opens a step: this stage's copies are in, and every warp is done with the last step
// (its stage, which the next copies refill, and sP, sdS). With two stages the next step's copies
// are issued in this step (after S^T's products), and no barrier closes a step (+0.3-2.6%,
// docs/KERNELS.md, "Order of work in a step"). The dQ box the copy engine read last step is then
// free for this step's stores (the same wait as the copies' in the machine code: the barrier
// orders it before every lane's stores).
template <bool kDqBoxCode> __device__ __forceinline__ void open_step(const CUtensorMap* const& dq_map) {
  cp_async_wait<0>();
  wait_dq_box_read<kDqBoxCode>(dq_map);
  __syncthreads();
}

template <class C> __device__ __forceinline__ void clear_grads(float (&dk)[C::kGradMTiles][C::kOutTiles][4],
                                                               float (&dv)[C::kGradMTiles][C::kOutTiles][4]) {
#pragma unroll
  for (int mt = 0; mt < C::kGradMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < C::kOutTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[mt][j][e] = dv[mt][j][e] = 0.f;
}

// acc = A B^T over the head dim for this warp's keys (A's rows at a_frag: K or V) and queries (B's
// at b_frag: Q or dO): S^T or dP^T. The first k-step starts from zero.
// between(i), where given, runs after k-step i with the k-loop unrolled fully: independent work
// (P^T's exponentials) that the tensor cores then run under.
template <class T, class C, int D, class Between>
__device__ __forceinline__ void transposed_product(float (&acc)[C::kMTiles][C::kQTiles][4], uint32_t a_frag,
                                                   uint32_t b_frag, Between between) {
  using Tile = typename C::Tile;
  const auto k_step = [&](int k0, auto first) {
    uint32_t ak[C::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt) ldmatrix_x4(ak[mt], Tile::at(a_frag, 16 * mt, k0));
#pragma unroll
    for (int j = 0; j < C::kQTiles; j += 2) {
      uint32_t bq[4];
      ldmatrix_x4(bq, Tile::at(b_frag, j * 8, k0));
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt) {
        mma_16x8x16<T, decltype(first)::value>(acc[mt][j], ak[mt], bq[0], bq[1]);
        mma_16x8x16<T, decltype(first)::value>(acc[mt][j + 1], ak[mt], bq[2], bq[3]);
      }
    }
  };
  k_step(0, std::true_type{});
  if constexpr (std::is_same_v<decltype(between), NoOp>) {
    // Two k-steps an iteration at D = 128 (unrolled fully, it spilled 892 bytes, and without
    // spills lost 0.5-0.6%). Unrolled fully elsewhere: +3% at D = 80, +1% at D = 64 with its
    // 128-query steps, +1% at D = 96, +1.5-1.8% at D = 256 (docs/KERNELS.md, "Tiles per head dim").
#pragma unroll(D == 128 ? 2 : 16)
    for (int k0 = 16; k0 < D; k0 += 16) k_step(k0, std::false_type{});
  } else {
    between(0);
#pragma unroll
    for (int k0 = 16; k0 < D; k0 += 16) {
      k_step(k0, std::false_type{});
      between(k0 / 16);
    }
  }
}

// This lane's 8 query columns' statistics (stats: their LSE, + kBlockM their delta), read into
// registers just before their use: read in place, every P^T or dS^T store to shared memory (which
// may alias them, for all the compiler knows) would reload them.
template <class C> __device__ __forceinline__ void column_stats(const float* stats, int which /* 0: LSE, 1: delta */,
                                                                float (&out)[C::kQTiles][2]) {
#pragma unroll
  for (int j = 0; j < C::kQTiles; ++j) {
    const float2 x = *reinterpret_cast<const float2*>(stats + which * C::kBlockM + j * 8);
    out[j][0] = x.x;
    out[j][1] = x.y;
  }
}

// P^T = exp(S^T - LSE) in place of S^T in p, masked (all zero for a warp whose keys this step does
// not visit: active), and into shared memory; dP^T = V dO^T into dp. check: some pair of the warp's
// is masked; base: pair (row r0 + m, key n0 + n) has diff base + n - m. Two uniform cases, so that
// the common one (every pair visible) is the exponentials alone: with the test beside each
// exponential, nvcc branched around every one (two branches and a convergence barrier a pair, ~20%
// of the step's instructions; ncu). Up to D = 128 that case runs P^T's exponentials and stores
// between dP^T's k-steps, a share of the fragments after each, so that the tensor cores work under
// them (+1-1.5% at D = 128, +3-7% at D = 64-96; 3.5% slower at D = 256: docs/KERNELS.md, "Order of
// work in a step").
template <class T, class C, int D>
__device__ __forceinline__ void probabilities_and_dp(const AttnArgs& a, const Region& reg, const int32_t& n0,
                                                     T* const& sP, const int& lane, const int& wh, const int& wrow0,
                                                     const uint32_t& k_rows, const uint32_t& q_cols,
                                                     const uint32_t& stage, const float* const& stats,
                                                     const bool& active, const bool& masked, const int32_t& base,
                                                     const bool& check, float (&p)[C::kMTiles][C::kQTiles][4],
                                                     float (&dp)[C::kMTiles][C::kQTiles][4]) {
  using Tile = typename C::Tile;
  using PTile = typename C::PTile;
  // LSE in log2 units. A row without keys (LSE = -inf) needs no case of its own here: every pair
  // of it is masked, and a masked P is selected as 0 (its exponential, +inf, is dropped), while a
  // visible pair's row has a key and so a finite LSE.
  float lse2[C::kQTiles][2];
  column_stats<C>(stats, 0, lse2);
#pragma unroll
  for (int j = 0; j < C::kQTiles; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) lse2[j][e] *= kLog2e;
  // P^T's fragment (mt, j) into shared memory; exp_p: its exponentials first, every pair visible.
  const auto store_p = [&](int mt, int j) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int n = wrow0 + 16 * mt + (lane >> 2) + hh * 8;
      const int m = C::kWarpM * wh + j * 8 + (lane & 3) * 2;
      *reinterpret_cast<uint32_t*>(sP + n * PTile::kPitch + m) = pack2<T>(p[mt][j][2 * hh], p[mt][j][2 * hh + 1]);
    }
  };
  const auto exp_p = [&](int mt, int j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) p[mt][j][e] = fast_exp2(fmaf(p[mt][j][e], a.scale_log2, -lse2[j][e & 1]));
    store_p(mt, j);
  };
  constexpr bool kExpUnderDp = D <= 128;
  if (kExpUnderDp && !check) {
    constexpr int kFrags = C::kMTiles * C::kQTiles, kSteps = D / 16;
    transposed_product<T, C, D>(dp, k_rows + C::kV, q_cols + stage + C::kDo, [&](int i) {
#pragma unroll
      for (int f = i * kFrags / kSteps; f < (i + 1) * kFrags / kSteps; ++f) exp_p(f / C::kQTiles, f % C::kQTiles);
    });
  } else {
    if (!check) {
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < C::kQTiles; ++j) exp_p(mt, j);
    } else {
      // Per key n of the lane, a band of query offsets (tiles.cuh): element (n, m = kWarpM wh +
      // 8 j + 2 (lane % 4) + e % 2) is visible iff -(8 j + e % 2) lies in its key's band.
      Band band[C::kMTiles][2];
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int n = wrow0 + 16 * mt + (lane >> 2) + 8 * h;
          const Band b = masked ? band_from(a.mask, base + n - C::kWarpM * wh - (lane & 3) * 2) : full_band();
          band[mt][h] = active && n0 + n < reg.col_end ? b : empty_band();
        }
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < C::kQTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const bool ok = in_band(band[mt][e >> 1], -(j * 8 + (e & 1)));
            p[mt][j][e] = ok ? fast_exp2(fmaf(p[mt][j][e], a.scale_log2, -lse2[j][e & 1])) : 0.f;
          }
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < C::kQTiles; ++j) store_p(mt, j);
    }
    transposed_product<T, C, D>(dp, k_rows + C::kV, q_cols + stage + C::kDo, NoOp{});
  }
}

// dS^T = P^T (dP^T - delta) into shared memory (P is 0 where masked). At D = 64 and 128 the
// softmax scale is folded in, as P^T (scale dP^T - scale delta), so that dK and dQ get it through
// dS and dQ is not scaled after each step's product (32 multiplies a lane at D = 128): +2-3.7%
// there with dQ's boxes, +1.5% (D = 128) and level (D = 64) with its atomics. Not at D = 80 and
// 96 (level with boxes, 1.5-2.5% slower with atomics) nor D = 256 (atomics, 6% slower):
// docs/KERNELS.md, "The softmax scale in dS".
template <class T, class C, bool kScaleInDs>
__device__ __forceinline__ void store_ds(const AttnArgs& a, T* sdS, const float (&p)[C::kMTiles][C::kQTiles][4],
                                         const float (&dp)[C::kMTiles][C::kQTiles][4], const float* stats, int wrow0,
                                         int lane, int wh) {
  using PTile = typename C::PTile;
  const float ds_scale = kScaleInDs ? a.scale : 1.f;
  float delta[C::kQTiles][2];
  column_stats<C>(stats, 1, delta);
#pragma unroll
  for (int j = 0; j < C::kQTiles; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) delta[j][e] *= ds_scale;
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < C::kQTiles; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int n = wrow0 + 16 * mt + (lane >> 2) + hh * 8;
        const int m = C::kWarpM * wh + j * 8 + (lane & 3) * 2;
        const float ds0 = p[mt][j][2 * hh] * fmaf(dp[mt][j][2 * hh], ds_scale, -delta[j][0]);
        const float ds1 = p[mt][j][2 * hh + 1] * fmaf(dp[mt][j][2 * hh + 1], ds_scale, -delta[j][1]);
        *reinterpret_cast<uint32_t*>(sdS + n * PTile::kPitch + m) = pack2<T>(ds0, ds1);
      }
}

// dK += dS^T Q on this warp's keys and columns; after(i) runs after k-step i (accumulate_grad).
template <class T, int D, int kMTiles, int kBlockM, class C, class After>
__device__ __forceinline__ void accumulate_dk(const uint32_t& p_rows, const uint32_t& do_cols, const uint32_t& stage,
                                              float (&dk)[C::kGradMTiles][C::kOutTiles][4], After after) {
  accumulate_grad<T, D, kMTiles, kBlockM>(dk, p_rows + C::kPBytes, do_cols + stage - C::kDo, after);
}

// dQ = dS K for the kDqGroup m16 tiles of this warp's rows from m0, scaled where dS is not.
template <class T, int D, class C, bool kScaleInDs>
__device__ __forceinline__ void dq_product(const AttnArgs& a, const uint32_t& ds_rows, const uint32_t& k_cols,
                                           const int& m0, float (&dq)[C::kDqGroup][C::kDqTiles][4]) {
  using Tile = typename C::Tile;
  using PTile = typename C::PTile;
  constexpr int kDqGroup = C::kDqGroup;
  // At D = 256 the first k-step's products start from zero rather than from cleared
  // registers: +2.3% there (docs/KERNELS.md, "Tiles per head dim"). Elsewhere equal or, written
  // as a separate first step, 3% slower at D = 128, so the flag folds into the unrolled loop.
  constexpr bool kZeroStart = D == 256;
  if constexpr (!kZeroStart) {
#pragma unroll
    for (int mt = 0; mt < kDqGroup; ++mt)
#pragma unroll
      for (int j = 0; j < C::kDqTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[mt][j][e] = 0.f;
  }
#pragma unroll
  for (int k0 = 0; k0 < C::kBlockN; k0 += 16) {
    const bool from_zero = kZeroStart && k0 == 0;
    uint32_t ads[kDqGroup][4];
#pragma unroll
    for (int mt = 0; mt < kDqGroup; ++mt)
      ldmatrix_x4_trans(ads[mt], PTile::at(ds_rows, k0, m0 + 16 * mt));
    mma_k_step<T, Tile>(dq, ads, k_cols, k0, from_zero);
  }
  // Where dS is not scaled: scaled in place, so that each atomic reads registers of its own (an
  // atomic reads its operands late, and a register it has not yet read cannot be written
  // again: ncu).
  if constexpr (!kScaleInDs) {
#pragma unroll
    for (int mt = 0; mt < kDqGroup; ++mt)
#pragma unroll
      for (int j = 0; j < C::kDqTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[mt][j][e] *= a.scale;
  }
}

// This lane's first column of row r in dQ's accumulator (dq_g: the step's batch and head).
__device__ __forceinline__ float* dq_row(const AttnArgs& a, float* const& dq_g, const int& dq_col0, const int& lane,
                                         int32_t r) {
  return dq_g + int64_t(r) * a.dq.token_stride + dq_col0 + (lane & 3) * 2;
}

// Where this lane's rows of dQ lie: the group from m0 of the warp's rows qrow0.. of step cur. One
// argument of references: with the four as arguments of dq_row_of's own, the kernel spilled more
// (D = 128, sm_90a: 28 + 44 bytes stored + loaded, against 24 + 12).
struct DqGroupRows {
  const QStep& cur;
  const int& qrow0;
  const int& lane;
  const int& m0;
};

// The row of this lane's half hh of m16 tile mt in the group.
__device__ __forceinline__ int32_t dq_row_of(const DqGroupRows& g, int mt, int hh) {
  return g.cur.r0 + g.qrow0 + g.m0 + 16 * mt + (g.lane >> 2) + hh * 8;
}

// This lane's part of dQ's row (mt, hh) of the group, added atomically at row (dq_row).
template <class C>
__device__ __forceinline__ void add_dq_row(const float (&dq)[C::kDqGroup][C::kDqTiles][4], int mt, int hh, float* row) {
#pragma unroll
  for (int j = 0; j < C::kDqTiles; ++j) atomic_add2(row + j * 8, dq[mt][j][2 * hh], dq[mt][j][2 * hh + 1]);
}

// dQ += scale dS K for the group of this warp's rows from m0 (kDqGroup m16 tiles), by the copy
// engine (dq_map, sm_90a code) or atomically into dq_g (dq_row). kAtomicsInDk: the atomics go
// between dK's k-steps, and dK is then done.
template <class T, int D, int kMTiles, int kBlockM, class C, bool kScaleInDs, bool kDqBoxCode, bool kAtomicsInDk>
__device__ __forceinline__ void add_dq_group(const AttnArgs& a, const Region& reg, const QStep& cur, const int& batch,
                                             const int& lane, const int& qrow0, const int& dq_col0,
                                             const uint32_t& ds_rows, const uint32_t& k_cols,
                                             unsigned char* const& dq_box, const CUtensorMap* const& dq_map,
                                             const uint32_t& p_rows, const uint32_t& do_cols, const uint32_t& stage,
                                             float (&dk)[C::kGradMTiles][C::kOutTiles][4], bool& dk_done,
                                             float* const& dq_g, const int& m0) {
  constexpr int kDqGroup = C::kDqGroup;
  float dq[kDqGroup][C::kDqTiles][4];
  dq_product<T, D, C, kScaleInDs>(a, ds_rows, k_cols, m0, dq);
#if ATTNCORE_SM90_DEVICE
  if constexpr (kDqBoxCode) {
    if (dq_map) {
      add_dq_box<C>(dq, dq_box, dq_map, dq_col0, cur.r0 + qrow0, cur.head, batch, lane);
      return; // boxes hold all of a warp's rows: this is the only group
    }
  }
#endif
  const DqGroupRows rows{cur, qrow0, lane, m0};
  if constexpr (kAtomicsInDk) {
    // Row i after dK's k-step i, with no branch (a branch would keep them apart from the
    // products): a row past the region adds its dQ, exactly 0 (its dO, delta and so dS are 0),
    // to the region's last row.
    static_assert(2 * kDqGroup <= kBlockM / 16, "a row a k-step");
    accumulate_dk<T, D, kMTiles, kBlockM, C>(p_rows, do_cols, stage, dk, [&](int i) {
      if (i < 2 * kDqGroup)
        add_dq_row<C>(dq, i / 2, i % 2,
                      dq_row(a, dq_g, dq_col0, lane, min(dq_row_of(rows, i / 2, i % 2), reg.row_end - 1)));
    });
    dk_done = true;
  } else {
#pragma unroll
    for (int mt = 0; mt < kDqGroup; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int32_t r = dq_row_of(rows, mt, hh);
        if (r < reg.row_end) add_dq_row<C>(dq, mt, hh, dq_row(a, dq_g, dq_col0, lane, r));
      }
  }
}

// dQ += scale dS K for this warp's rows and columns, by the copy engine (dq_map) or atomically,
// kDqGroup m16 tiles of rows at a time: all of them (one B fragment for both, +1% at D = 64 and
// 128), but one at D = 256, where two hold 64 more registers and spill 108 bytes. Up to D = 96
// (kAtomicsInDk) the atomics go between dK's k-steps (grads_and_dq says why), and dK is then done
// (dk_done).
template <class T, int D, int kMTiles, int kBlockM, class C, bool kScaleInDs, bool kDqBoxCode>
__device__ __forceinline__ void add_dq(const AttnArgs& a, const Region& reg, const QStep& cur, const int& batch,
                                       const int& lane, const int& qrow0, const int& dq_col0, const uint32_t& ds_rows,
                                       const uint32_t& k_cols, unsigned char* const& dq_box,
                                       const CUtensorMap* const& dq_map, const uint32_t& p_rows,
                                       const uint32_t& do_cols, const uint32_t& stage,
                                       float (&dk)[C::kGradMTiles][C::kOutTiles][4], bool& dk_done) {
  constexpr bool kAtomicsInDk = D <= 96;
  float* const dq_g = static_cast<float*>(a.dq.data) + batch * a.dq.batch_stride + cur.head * a.dq.head_stride;
#pragma unroll
  for (int m0 = 0; m0 < C::kDqRows; m0 += 16 * C::kDqGroup)
    add_dq_group<T, D, kMTiles, kBlockM, C, kScaleInDs, kDqBoxCode, kAtomicsInDk>(
        a, reg, cur, batch, lane, qrow0, dq_col0, ds_rows, k_cols, dq_box, dq_map, p_rows, do_cols, stage, dk, dk_done,
        dq_g, m0);
}

// dV += P^T dO and dK += dS^T Q on this warp's keys and columns, and with accumulate_dq, dQ
// (add_dq). Their order: dV, dQ, dK, where dQ goes to the copy engine (sm_90a code, up to D = 128):
// its stores and bulk reduce then run under dK's products (at D = 128, +5.5% against dK before
// dQ). With atomics, per head dim: an atomic reads its operands late, so dQ's atomics issued
// together held the instructions after them that rewrote their registers (7.5% of the stall
// samples at D = 64, ncu). Up to D = 96: dV, dQ, then dK with dQ's atomics after its first
// k-steps, a row each (+1.5% at D = 64, +2.7% at D = 96, +5.5% at D = 80; 0.5-0.8% slower at
// D = 128). D = 128: dV, dK, dQ. D = 256: dV, dQ, dK (+1.5-2% there; 1-2% slower at D = 80-128).
// docs/KERNELS.md, "Order of work in a step".
template <class T, int D, int kMTiles, int kBlockM, class C, bool kDqBoxCode>
__device__ __forceinline__ void grads_and_dq(const AttnArgs& a, const Region& reg, const QStep& cur, const int& batch,
                                             const int& lane, const int& qrow0, const int& dq_col0,
                                             const uint32_t& p_rows, const uint32_t& do_cols, const uint32_t& ds_rows,
                                             const uint32_t& k_cols, const uint32_t& stage,
                                             unsigned char* const& dq_box, const CUtensorMap* const& dq_map,
                                             float (&dk)[C::kGradMTiles][C::kOutTiles][4],
                                             float (&dv)[C::kGradMTiles][C::kOutTiles][4]) {
  constexpr bool kDkBeforeDq = D == 128 && !kDqBoxCode;
  accumulate_grad<T, D, kMTiles, kBlockM>(dv, p_rows, do_cols + stage);
  if constexpr (kDkBeforeDq) accumulate_dk<T, D, kMTiles, kBlockM, C>(p_rows, do_cols, stage, dk, NoOp{});
  bool dk_done = kDkBeforeDq;
  if (a.accumulate_dq)
    add_dq<T, D, kMTiles, kBlockM, C, C::kScaleInDs, kDqBoxCode>(a, reg, cur, batch, lane, qrow0, dq_col0, ds_rows,
                                                                  k_cols, dq_box, dq_map, p_rows, do_cols, stage, dk,
                                                                  dk_done);
  if (!dk_done) accumulate_dk<T, D, kMTiles, kBlockM, C>(p_rows, do_cols, stage, dk, NoOp{});
}

// dK (scaled: here, or through dS) and dV into the fp32 accumulators, or written (write_dkdv:
// segments that do not share keys). Without segments this CTA is the only writer of these keys;
// with segments whose key ranges overlap it is not, hence the atomic adds (one add per element and
// call: the result does not depend on their order when keys are owned).
template <class T, class C, bool kScaleInDs>
__device__ __forceinline__ void write_dkdv(const AttnArgs& a, const Region& reg, const int32_t& n0, const int& kv_head,
                                           const int& batch, const int& lane, const int& grow0, const int& col0,
                                           float (&dk)[C::kGradMTiles][C::kOutTiles][4],
                                           float (&dv)[C::kGradMTiles][C::kOutTiles][4]) {
#pragma unroll
  for (int mt = 0; mt < C::kGradMTiles; ++mt) {
    if constexpr (!kScaleInDs) {
#pragma unroll
      for (int j = 0; j < C::kOutTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[mt][j][e] *= a.scale;
    }
    const int32_t key = n0 + grow0 + 16 * mt + (lane >> 2);
    const int col = col0 + (lane & 3) * 2;
    add_grad_tile(a.dk_add, batch, kv_head, key, a.add_begin, a.add_end, col, dk[mt]);
    add_grad_tile(a.dv_add, batch, kv_head, key, a.add_begin, a.add_end, col, dv[mt]);
    put_grad_tile<T>(a.dk, batch, kv_head, key, reg.col_end, col, dk[mt], a.dkdv_out);
    put_grad_tile<T>(a.dv, batch, kv_head, key, reg.col_end, col, dv[mt], a.dkdv_out);
  }
}

// ---- dQ alone (deterministic mode) ----------------------------------------------------------------

// kMTiles query m16 tiles a warp: 2 up to D = 128; 1 at D = 256 (registers) and at D = 128 where
// the device's shared memory is too small for 2.
template <class T, int D, int kMTiles_> struct DqConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kBlockM = kWarps * kWarpRows;
  static constexpr int kBlockN = 32; // narrow key tiles: S and dP of 32 rows stay in registers beside dQ
  using Tile = HeadTile<T, D>; // Q, dO, K, V (smem_tile.h)
  static constexpr int kSTiles = kBlockN / 8;
  static constexpr int kOTiles = D / 8;
  static constexpr uint32_t kQBytes = Tile::bytes(kBlockM), kKBytes = Tile::bytes(kBlockN);
  static constexpr size_t kSmemBytes = kSmemAlign + 2 * kQBytes + 2 * 2 * kKBytes;
  static_assert(kBlockM <= 128, "a row tile spans at most two query blocks of a block list");
  static_assert(kSmemBytes <= 160 * 1024, "must fit an sm_80 CTA");
};

// ---- dQ: the steps of flash_backward_dq_kernel ---------------------------------------------------

// The CTA's row tile x (counted from the grid's last CTA): its region, and its first row m0 there.
// False where x is past the segments' row tiles.
template <class C> __device__ __forceinline__ bool locate_rows(const AttnArgs& a, int32_t x, Region& reg, int32_t& m0) {
  if (a.nseg > 0) {
    int32_t seg, tile;
    if (!locate_tile(a.segs, a.nseg, x, C::kBlockM, true, seg, tile)) return false;
    reg = segment_region(a.segs[seg]);
    m0 = reg.row_begin + tile * C::kBlockM;
  } else {
    reg = whole_call(a.mask, a.seqlen_q, a.seqlen_kv);
    m0 = x * C::kBlockM;
  }
  return true;
}

// Q and dO of the row tile [m0, m1) into shared memory.
template <class T, class C>
__device__ __forceinline__ void load_q_do(const AttnArgs& a, T* const& sQ, T* const& sdO, const int& head,
                                          const int& batch, const int& tid, const int32_t& m0, const int32_t& m1) {
  using Tile = typename C::Tile;
  const int64_t qoff = batch * a.q.batch_stride + head * a.q.head_stride + int64_t(m0) * a.q.token_stride;
  const int64_t ooff = batch * a.d_o.batch_stride + head * a.d_o.head_stride + int64_t(m0) * a.d_o.token_stride;
  load_tile_async<C::kBlockM, Tile, C::kThreads>(sQ, static_cast<const T*>(a.q.data) + qoff, a.q.token_stride,
                                                 m1 - m0, tid);
  load_tile_async<C::kBlockM, Tile, C::kThreads>(sdO, static_cast<const T*>(a.d_o.data) + ooff, a.d_o.token_stride,
                                                 m1 - m0, tid);
}

// K and V of the key tile from c0 into buffer st (sK, sV: two buffers each).
template <class T, class C>
__device__ __forceinline__ void load_kv(const AttnArgs& a, unsigned char* const& sK, unsigned char* const& sV,
                                        const T* const& k, const T* const& v, const Region& reg, const int& tid, int st,
                                        int32_t c0) {
  using Tile = typename C::Tile;
  load_tile_async<C::kBlockN, Tile, C::kThreads>(reinterpret_cast<T*>(sK + st * C::kKBytes),
                                                 k + int64_t(c0) * a.k.token_stride, a.k.token_stride,
                                                 reg.col_end - c0, tid);
  load_tile_async<C::kBlockN, Tile, C::kThreads>(reinterpret_cast<T*>(sV + st * C::kKBytes),
                                                 v + int64_t(c0) * a.v.token_stride, a.v.token_stride,
                                                 reg.col_end - c0, tid);
}

// This lane's rows: LSE (log2 units; +inf where there is no key or no row) and delta.
template <class C>
__device__ __forceinline__ void row_stats(const AttnArgs& a, const int& head, const int& batch, const int& lane,
                                          const int32_t& m0, const int32_t& m1, const int32_t& warp_row0,
                                          float (&lse2)[C::kMTiles][2], float (&delta)[C::kMTiles][2]) {
  constexpr int MT = C::kMTiles;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int32_t r = m0 + warp_row0 + 16 * mt + (lane >> 2) + hh * 8;
      lse2[mt][hh] = INFINITY;
      delta[mt][hh] = 0.f;
      if (r < m1) {
        const float lse = a.lse.data[batch * a.lse.batch_stride + head * a.lse.head_stride + r];
        lse2[mt][hh] = lse == -INFINITY ? INFINITY : lse * kLog2e;
        delta[mt][hh] = a.delta.data[batch * a.delta.batch_stride + head * a.delta.head_stride + r];
      }
    }
}

template <class C>
__device__ __forceinline__ void clear_dq(float (&dq)[C::kMTiles][C::kOTiles][4]) {
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < C::kOTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq[mt][j][e] = 0.f;
}

// The walk over the key tiles that rows [m0, m1) see: the mask's interval, or with a block list
// the union of the rows' (at most two) query blocks' lists. Returns which of a step's two query
// blocks (KvStep::active, masked) this warp's rows lie in.
template <class C>
__device__ __forceinline__ int init_kv_walk(const AttnArgs& a, const Region& reg, const int& head, const int32_t& m0,
                                            const int32_t& m1, const int32_t& warp_row0, KvWalk<C::kBlockN>& walk) {
  if (a.blocks.heads > 0) {
    const int32_t row = (a.blocks.heads == 1 ? 0 : head) * a.blocks.num_q_blocks;
    const int32_t qb0 = m0 / a.blocks.block_q, qb1 = (m1 - 1) / a.blocks.block_q;
    walk.init_blocks(a.blocks, row + qb0, row + qb1);
    return (m0 + warp_row0) / a.blocks.block_q == qb0 ? 0 : 1;
  }
  walk.init_interval(a.mask, reg, m0, m1);
  return 0;
}

// S = Q K^T and dP = dO V^T for this warp's rows over the key tile in buffer buf: Q's A fragments
// at q_frag (dO's + kQBytes), K's and V's B at k_nk and v_nk.
template <class T, class C, int D>
__device__ __forceinline__ void scores_and_dp(const uint32_t& q_frag, const uint32_t& k_nk, const uint32_t& v_nk,
                                              const uint32_t& buf, float (&s)[C::kMTiles][C::kSTiles][4],
                                              float (&dp)[C::kMTiles][C::kSTiles][4]) {
  using Tile = typename C::Tile;
  constexpr int MT = C::kMTiles;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][j][e] = dp[mt][j][e] = 0.f;
#pragma unroll
  for (int k0 = 0; k0 < D; k0 += 16) {
    uint32_t aq[MT][4], ao[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      ldmatrix_x4(aq[mt], Tile::at(q_frag, 16 * mt, k0));
      ldmatrix_x4(ao[mt], Tile::at(q_frag + C::kQBytes, 16 * mt, k0));
    }
#pragma unroll
    for (int n0 = 0; n0 < C::kBlockN; n0 += 16) {
      uint32_t bk[4], bv[4];
      ldmatrix_x4(bk, Tile::at(k_nk + buf, n0, k0));
      ldmatrix_x4(bv, Tile::at(v_nk + buf, n0, k0));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16x8x16<T>(s[mt][n0 / 8], aq[mt], bk[0], bk[1]);
        mma_16x8x16<T>(s[mt][n0 / 8 + 1], aq[mt], bk[2], bk[3]);
        mma_16x8x16<T>(dp[mt][n0 / 8], ao[mt], bv[0], bv[1]);
        mma_16x8x16<T>(dp[mt][n0 / 8 + 1], ao[mt], bv[2], bv[3]);
      }
    }
  }
}

// dS = P (dP - delta) in place of S, where P = exp(scale S - LSE), masked: per row of the lane, a
// band of column offsets (tiles.cuh), element (r, 8 j + 2 (lane % 4) + e % 2) visible iff
// 8 j + e % 2 lies in its row's band.
template <class C>
__device__ __forceinline__ void ds_from_scores(const AttnArgs& a, const Region& reg, const KvStep& cur,
                                               const int32_t& m0, const int32_t& warp_row0, const int& lane,
                                               const bool& masked, const float (&lse2)[C::kMTiles][2],
                                               const float (&delta)[C::kMTiles][2],
                                               float (&s)[C::kMTiles][C::kSTiles][4],
                                               const float (&dp)[C::kMTiles][C::kSTiles][4]) {
  constexpr int MT = C::kMTiles;
  const int32_t base = reg.diff(m0 + warp_row0, cur.c0);
  const bool check = masked || cur.cross;
  Band band[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      band[mt][h] = row_band(a.mask, masked, base, 16 * mt + 8 * h + (lane >> 2), reg.col_end - cur.c0, lane);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hh = e >> 1;
        const bool ok = !check || in_band(band[mt][hh], j * 8 + (e & 1));
        const float p = ok ? fast_exp2(fmaf(s[mt][j][e], a.scale_log2, -lse2[mt][hh])) : 0.f;
        s[mt][j][e] = p * (dp[mt][j][e] - delta[mt][hh]);
      }
}

// dQ += dS K over the key tile in buffer buf (K's B fragments, k-major, at k_kn).
template <class T, class C, int D>
__device__ __forceinline__ void add_ds_k(const float (&ds)[C::kMTiles][C::kSTiles][4], const uint32_t& k_kn,
                                         const uint32_t& buf, float (&dq)[C::kMTiles][C::kOTiles][4]) {
  using Tile = typename C::Tile;
  constexpr int MT = C::kMTiles;
#pragma unroll
  for (int k0 = 0; k0 < C::kBlockN; k0 += 16) {
    uint32_t ads[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) c_to_a<T>(ads[mt], ds[mt][k0 / 8], ds[mt][k0 / 8 + 1]);
#pragma unroll
    for (int n0 = 0; n0 < D; n0 += 16) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, Tile::at(k_kn + buf, k0, n0));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16x8x16<T>(dq[mt][n0 / 8], ads[mt], b[0], b[1]);
        mma_16x8x16<T>(dq[mt][n0 / 8 + 1], ads[mt], b[2], b[3]);
      }
    }
  }
}

// dQ (scaled) added into the fp32 accumulator: this CTA owns its rows (rows lie in at most one
// segment), so a plain read-add-write.
template <class C>
__device__ __forceinline__ void write_dq(const AttnArgs& a, const int& head, const int& batch, const int& lane,
                                         const int32_t& m0, const int32_t& m1, const int32_t& warp_row0,
                                         const float (&dq)[C::kMTiles][C::kOTiles][4]) {
  float* dq_g = static_cast<float*>(a.dq.data) + batch * a.dq.batch_stride + head * a.dq.head_stride;
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int32_t r = m0 + warp_row0 + 16 * mt + (lane >> 2) + hh * 8;
      if (r >= m1) continue;
#pragma unroll
      for (int j = 0; j < C::kOTiles; ++j) {
        float2* p = reinterpret_cast<float2*>(dq_g + int64_t(r) * a.dq.token_stride + j * 8 + (lane & 3) * 2);
        float2 x2 = *p;
        x2.x += a.scale * dq[mt][j][2 * hh];
        x2.y += a.scale * dq[mt][j][2 * hh + 1];
        *p = x2;
      }
    }
}

} // namespace attncore::cuda
