// Flash-attention backward (FlashAttention-2's algorithm) on mma.sync m16n8k16, from the final O's
// LSE and delta = rowsum(dO * O):
//     P = exp(scale q.k - LSE),  dP = dO V^T,  dS = P (dP - delta),
//     dV += P^T dO,  dK += scale dS^T Q,  dQ += scale dS K.
//
// dK/dV kernel: a CTA of 8 warps owns 64 keys of one (batch, kv head) and walks every (query head
// of the GQA group, 64-row query tile) that sees them (QWalk), so dK and dV are summed in registers
// and written once, without atomics: deterministic. Warp (r, h) computes S^T and dP^T for keys
// 16r..16r+15 and queries 32h..32h+31; P^T and dS^T go through shared memory to become the A
// operands of dV and dK, whose columns are split between the two warps of a row (h = half).
// With accumulate_dq it also adds dQ = scale dS K into the fp32 accumulator atomically (the
// default, fast path). Deterministic mode leaves dQ to the dQ kernel below, which recomputes S and
// dP per query tile and owns its rows: two more products, no atomics.
#pragma once

#include "args.h"
#include "device.cuh"
#include "launch.h"
#include "tiles.cuh"

namespace attncore::cuda {

template <class T, int D> struct BackwardConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = 64; // keys per CTA
  static constexpr int kBlockM = 64; // queries per step
  static constexpr int kStages = D <= 128 ? 2 : 1; // Q/dO double buffer where shared memory allows
  static constexpr int kPitch = D + 8;
  static constexpr int kPitchP = kBlockM + 8;
  static constexpr int kHalfTiles = D / 16; // output n-tiles per warp (half of D / 8)
  static constexpr size_t kSmemBytes = size_t(2 * kBlockN + 2 * kStages * kBlockM) * kPitch * sizeof(T) +
                                       size_t(2 * kBlockN * kPitchP) * sizeof(T) +
                                       size_t(2 * kStages * kBlockM) * sizeof(float);
  static_assert(D % 16 == 0, "head dim must be a multiple of 16");
  static_assert(kSmemBytes <= 160 * 1024, "must fit an sm_80 CTA");
};

// out[j] += A (16 x 64 over queries, from a [16 rows][kPitchP] tile) times B (queries x this warp's
// half of the head dim), for the 64 queries of one step.
template <class T, int D>
__device__ __forceinline__ void accumulate_half(float (&out)[D / 16][4], const T* a_tile, int a_row0, const T* b_tile,
                                                int col0, int lane) {
  using C = BackwardConfig<T, D>;
#pragma unroll
  for (int k0 = 0; k0 < C::kBlockM; k0 += 16) {
    uint32_t a[4];
    load_a<T>(a, a_tile, C::kPitchP, a_row0, k0, lane);
#pragma unroll
    for (int j = 0; j < C::kHalfTiles; j += 2) {
      if (j + 1 < C::kHalfTiles) {
        uint32_t b[4];
        load_b_kn<T>(b, b_tile, C::kPitch, k0, col0 + j * 8, lane);
        mma_16x8x16<T>(out[j], a, b[0], b[1]);
        mma_16x8x16<T>(out[j + 1], a, b[2], b[3]);
      } else { // an odd count of n-tiles (D = 80)
        uint32_t b[2];
        load_b_kn_single<T>(b, b_tile, C::kPitch, k0, col0 + j * 8, lane);
        mma_16x8x16<T>(out[j], a, b[0], b[1]);
      }
    }
  }
}

template <class T, int D>
__global__ void __launch_bounds__(BackwardConfig<T, D>::kThreads, 1)
    flash_backward_dkdv_kernel(const __grid_constant__ AttnArgs a) {
  using C = BackwardConfig<T, D>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + C::kBlockN * C::kPitch;
  T* sQ = sV + C::kBlockN * C::kPitch;          // [kStages][kBlockM][kPitch]
  T* sdO = sQ + C::kStages * C::kBlockM * C::kPitch;
  T* sP = sdO + C::kStages * C::kBlockM * C::kPitch; // P^T  [kBlockN][kPitchP]
  T* sdS = sP + C::kBlockN * C::kPitchP;            // dS^T
  float* sLse2 = reinterpret_cast<float*>(sdS + C::kBlockN * C::kPitchP); // [kStages][kBlockM]
  float* sDelta = sLse2 + C::kStages * C::kBlockM;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wr = warp & 3, wh = warp >> 2; // 16-key slice, half
  const int kv_head = blockIdx.y, batch = blockIdx.z;
  const int32_t x = int32_t(blockIdx.x);

  Region reg;
  int32_t n0;
  if (a.nseg > 0) {
    int32_t seg, tile;
    if (!locate_tile(a.segs, a.nseg, x, C::kBlockN, false, seg, tile)) return;
    reg = segment_region(a.segs[seg]);
    n0 = reg.col_begin + tile * C::kBlockN;
  } else {
    reg = whole_call(a.mask, a.seqlen_q, a.seqlen_kv);
    n0 = x * C::kBlockN;
  }

  const T* k = static_cast<const T*>(a.k.data) + batch * a.k.batch_stride + kv_head * a.k.head_stride;
  const T* v = static_cast<const T*>(a.v.data) + batch * a.v.batch_stride + kv_head * a.v.head_stride;
  load_tile_async<C::kBlockN, D, C::kThreads>(sK, C::kPitch, k + int64_t(n0) * a.k.token_stride, a.k.token_stride,
                                              reg.col_end - n0, tid);
  load_tile_async<C::kBlockN, D, C::kThreads>(sV, C::kPitch, v + int64_t(n0) * a.v.token_stride, a.v.token_stride,
                                              reg.col_end - n0, tid);

  QWalk<C::kBlockM, C::kBlockN> walk;
  walk.init(a.mask, reg, a.blocks, kv_head * a.group, a.group, n0);

  // Q, dO, and the rows' statistics of one step into stage `st`. Rows past the region get
  // LSE = +inf (so P = 0) and delta = 0: they add nothing, whatever their Q.
  const auto load_step = [&](int st, const QStep& s) {
    const int64_t qoff = batch * a.q.batch_stride + s.head * a.q.head_stride + int64_t(s.r0) * a.q.token_stride;
    const int64_t ooff = batch * a.d_o.batch_stride + s.head * a.d_o.head_stride + int64_t(s.r0) * a.d_o.token_stride;
    load_tile_async<C::kBlockM, D, C::kThreads>(sQ + st * C::kBlockM * C::kPitch, C::kPitch,
                                                static_cast<const T*>(a.q.data) + qoff, a.q.token_stride,
                                                reg.row_end - s.r0, tid);
    load_tile_async<C::kBlockM, D, C::kThreads>(sdO + st * C::kBlockM * C::kPitch, C::kPitch,
                                                static_cast<const T*>(a.d_o.data) + ooff, a.d_o.token_stride,
                                                reg.row_end - s.r0, tid);
    if (tid < C::kBlockM) {
      const int32_t r = s.r0 + tid;
      float lse2 = INFINITY, delta = 0.f;
      if (r < reg.row_end) {
        const float lse = a.lse.data[batch * a.lse.batch_stride + s.head * a.lse.head_stride + r];
        lse2 = lse == -INFINITY ? INFINITY : lse * kLog2e; // a row without keys: P = 0
        delta = a.delta.data[batch * a.delta.batch_stride + s.head * a.delta.head_stride + r];
      }
      sLse2[st * C::kBlockM + tid] = lse2;
      sDelta[st * C::kBlockM + tid] = delta;
    }
  };

  float dk[C::kHalfTiles][4], dv[C::kHalfTiles][4];
#pragma unroll
  for (int j = 0; j < C::kHalfTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.f;

  QStep cur;
  bool have = walk.next(cur);
  if (have) load_step(0, cur);
  cp_async_commit();
  int st = 0;
  while (have) {
    QStep nxt;
    const bool have_next = walk.next(nxt);
    if constexpr (C::kStages == 2) {
      if (have_next) load_step(st ^ 1, nxt);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* q_s = sQ + st * C::kBlockM * C::kPitch;
    const T* do_s = sdO + st * C::kBlockM * C::kPitch;
    const float* lse2 = sLse2 + st * C::kBlockM;
    const float* delta = sDelta + st * C::kBlockM;

    // 1. S^T = K Q^T and dP^T = V dO^T for keys 16 wr.., queries 32 wh..
    float s[4][4], dp[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t ak[4], av[4];
      load_a<T>(ak, sK, C::kPitch, 16 * wr, k0, lane);
      load_a<T>(av, sV, C::kPitch, 16 * wr, k0, lane);
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        uint32_t bq[4], bo[4];
        load_b_nk<T>(bq, q_s, C::kPitch, 32 * wh + j * 8, k0, lane);
        load_b_nk<T>(bo, do_s, C::kPitch, 32 * wh + j * 8, k0, lane);
        mma_16x8x16<T>(s[j], ak, bq[0], bq[1]);
        mma_16x8x16<T>(s[j + 1], ak, bq[2], bq[3]);
        mma_16x8x16<T>(dp[j], av, bo[0], bo[1]);
        mma_16x8x16<T>(dp[j + 1], av, bo[2], bo[3]);
      }
    }
    // 2. P^T and dS^T, masked, into shared memory.
    const int32_t base = reg.diff(cur.r0, n0); // (row r0 + m, key n0 + n) has diff base + n - m
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int n = 16 * wr + (lane >> 2) + hh * 8;
        const int m = 32 * wh + j * 8 + (lane & 3) * 2;
        float p[2], ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          p[e] = fast_exp2(fmaf(s[j][2 * hh + e], a.scale_log2, -lse2[m + e]));
          const bool ok = n0 + n < reg.col_end && (!cur.masked || visible(a.mask, base + n - (m + e)));
          if (!ok) p[e] = 0.f;
          ds[e] = p[e] * (dp[j][2 * hh + e] - delta[m + e]);
        }
        *reinterpret_cast<uint32_t*>(sP + n * C::kPitchP + m) = pack2<T>(p[0], p[1]);
        *reinterpret_cast<uint32_t*>(sdS + n * C::kPitchP + m) = pack2<T>(ds[0], ds[1]);
      }
    __syncthreads();

    // 3. dV += P^T dO, dK += dS^T Q on this warp's keys and half of the head dim.
    accumulate_half<T, D>(dv, sP, 16 * wr, do_s, wh * (D / 2), lane);
    accumulate_half<T, D>(dk, sdS, 16 * wr, q_s, wh * (D / 2), lane);

    // 4. dQ += scale dS K for queries 16 wr.., this half of the head dim, added atomically.
    if (a.accumulate_dq) {
      float dq[C::kHalfTiles][4];
#pragma unroll
      for (int j = 0; j < C::kHalfTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[j][e] = 0.f;
#pragma unroll
      for (int k0 = 0; k0 < C::kBlockN; k0 += 16) {
        uint32_t ads[4];
        load_a_trans<T>(ads, sdS, C::kPitchP, 16 * wr, k0, lane); // dS = (dS^T)^T
#pragma unroll
        for (int j = 0; j < C::kHalfTiles; j += 2) {
          if (j + 1 < C::kHalfTiles) {
            uint32_t b[4];
            load_b_kn<T>(b, sK, C::kPitch, k0, wh * (D / 2) + j * 8, lane);
            mma_16x8x16<T>(dq[j], ads, b[0], b[1]);
            mma_16x8x16<T>(dq[j + 1], ads, b[2], b[3]);
          } else {
            uint32_t b[2];
            load_b_kn_single<T>(b, sK, C::kPitch, k0, wh * (D / 2) + j * 8, lane);
            mma_16x8x16<T>(dq[j], ads, b[0], b[1]);
          }
        }
      }
      float* dq_g = static_cast<float*>(a.dq.data) + batch * a.dq.batch_stride + cur.head * a.dq.head_stride;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int32_t r = cur.r0 + 16 * wr + (lane >> 2) + hh * 8;
        if (r >= reg.row_end) continue;
        float* row = dq_g + int64_t(r) * a.dq.token_stride + wh * (D / 2) + (lane & 3) * 2;
#pragma unroll
        for (int j = 0; j < C::kHalfTiles; ++j) {
          atomicAdd(row + j * 8, a.scale * dq[j][2 * hh]);
          atomicAdd(row + j * 8 + 1, a.scale * dq[j][2 * hh + 1]);
        }
      }
    }
    __syncthreads(); // sP, sdS and this stage are free again
    if constexpr (C::kStages == 1) {
      if (have_next) load_step(0, nxt);
      cp_async_commit();
    }
    cur = nxt;
    have = have_next;
    st ^= C::kStages - 1;
  }
  cp_async_wait<0>();

  // dK (times scale) and dV into the fp32 accumulators. Without segments this CTA is the only
  // writer of these keys; with segments whose key ranges overlap it is not, hence the atomic adds
  // (one add per element and call: the result does not depend on their order when keys are owned).
  float* dk_g = static_cast<float*>(a.dk.data) + batch * a.dk.batch_stride + kv_head * a.dk.head_stride;
  float* dv_g = static_cast<float*>(a.dv.data) + batch * a.dv.batch_stride + kv_head * a.dv.head_stride;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int32_t n = n0 + 16 * wr + (lane >> 2) + hh * 8;
    if (n >= reg.col_end) continue;
    const int col = wh * (D / 2) + (lane & 3) * 2;
    float* pk = dk_g + int64_t(n) * a.dk.token_stride + col;
    float* pv = dv_g + int64_t(n) * a.dv.token_stride + col;
#pragma unroll
    for (int j = 0; j < C::kHalfTiles; ++j) {
      atomicAdd(pk + j * 8, a.scale * dk[j][2 * hh]);
      atomicAdd(pk + j * 8 + 1, a.scale * dk[j][2 * hh + 1]);
      atomicAdd(pv + j * 8, dv[j][2 * hh]);
      atomicAdd(pv + j * 8 + 1, dv[j][2 * hh + 1]);
    }
  }
}

// ---- dQ alone (deterministic mode) ----------------------------------------------------------------

template <class T, int D> struct DqConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = 64; // 16 rows per warp
  static constexpr int kBlockN = 64;
  static constexpr int kStages = D <= 128 ? 2 : 1;
  static constexpr int kPitch = D + 8;
  static constexpr int kSTiles = kBlockN / 8;
  static constexpr int kOTiles = D / 8;
  static constexpr size_t kSmemBytes = size_t(2 * kBlockM + 2 * kStages * kBlockN) * kPitch * sizeof(T);
  static_assert(kSmemBytes <= 160 * 1024, "must fit an sm_80 CTA");
};

template <class T, int D>
__global__ void __launch_bounds__(DqConfig<T, D>::kThreads, 1) flash_backward_dq_kernel(const __grid_constant__ AttnArgs a) {
  using C = DqConfig<T, D>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + C::kBlockM * C::kPitch;
  T* sK = sdO + C::kBlockM * C::kPitch; // [kStages][kBlockN][kPitch]
  T* sV = sK + C::kStages * C::kBlockN * C::kPitch;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int head = blockIdx.y, batch = blockIdx.z, kv_head = head / a.group;
  const int32_t x = int32_t(gridDim.x - 1 - blockIdx.x);

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
  const int32_t row0 = m0 + warp * 16;

  const int64_t qoff = batch * a.q.batch_stride + head * a.q.head_stride + int64_t(m0) * a.q.token_stride;
  const int64_t ooff = batch * a.d_o.batch_stride + head * a.d_o.head_stride + int64_t(m0) * a.d_o.token_stride;
  load_tile_async<C::kBlockM, D, C::kThreads>(sQ, C::kPitch, static_cast<const T*>(a.q.data) + qoff, a.q.token_stride,
                                              m1 - m0, tid);
  load_tile_async<C::kBlockM, D, C::kThreads>(sdO, C::kPitch, static_cast<const T*>(a.d_o.data) + ooff,
                                              a.d_o.token_stride, m1 - m0, tid);
  const T* k = static_cast<const T*>(a.k.data) + batch * a.k.batch_stride + kv_head * a.k.head_stride;
  const T* v = static_cast<const T*>(a.v.data) + batch * a.v.batch_stride + kv_head * a.v.head_stride;

  // This lane's two rows: LSE (log2 units; +inf where there is no key or no row) and delta.
  float lse2[2], delta[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int32_t r = row0 + (lane >> 2) + hh * 8;
    lse2[hh] = INFINITY;
    delta[hh] = 0.f;
    if (r < m1) {
      const float lse = a.lse.data[batch * a.lse.batch_stride + head * a.lse.head_stride + r];
      lse2[hh] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      delta[hh] = a.delta.data[batch * a.delta.batch_stride + head * a.delta.head_stride + r];
    }
  }

  KvWalk<C::kBlockN> walk; // a 64-row tile lies in one query block of a block list
  if (a.blocks.heads > 0) {
    const int32_t row = (a.blocks.heads == 1 ? 0 : head) * a.blocks.num_q_blocks + m0 / a.blocks.block_q;
    walk.init_blocks(a.mask, reg, a.blocks, row, row);
  } else {
    walk.init_interval(a.mask, reg, m0, m1);
  }
  const auto load_kv = [&](int st, int32_t c0) {
    load_tile_async<C::kBlockN, D, C::kThreads>(sK + st * C::kBlockN * C::kPitch, C::kPitch,
                                                k + int64_t(c0) * a.k.token_stride, a.k.token_stride,
                                                reg.col_end - c0, tid);
    load_tile_async<C::kBlockN, D, C::kThreads>(sV + st * C::kBlockN * C::kPitch, C::kPitch,
                                                v + int64_t(c0) * a.v.token_stride, a.v.token_stride,
                                                reg.col_end - c0, tid);
  };

  float dq[C::kOTiles][4];
#pragma unroll
  for (int j = 0; j < C::kOTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[j][e] = 0.f;

  KvStep cur;
  bool have = walk.next(cur);
  if (have) load_kv(0, cur.c0);
  cp_async_commit();
  int st = 0;
  while (have) {
    KvStep nxt;
    const bool have_next = walk.next(nxt);
    if constexpr (C::kStages == 2) {
      if (have_next) load_kv(st ^ 1, nxt.c0);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* k_s = sK + st * C::kBlockN * C::kPitch;
    const T* v_s = sV + st * C::kBlockN * C::kPitch;

    // S = Q K^T, dP = dO V^T for this warp's 16 rows.
    float s[C::kSTiles][4], dp[C::kSTiles][4];
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t aq[4], ao[4];
      load_a<T>(aq, sQ, C::kPitch, warp * 16, k0, lane);
      load_a<T>(ao, sdO, C::kPitch, warp * 16, k0, lane);
#pragma unroll
      for (int n0 = 0; n0 < C::kBlockN; n0 += 16) {
        uint32_t bk[4], bv[4];
        load_b_nk<T>(bk, k_s, C::kPitch, n0, k0, lane);
        load_b_nk<T>(bv, v_s, C::kPitch, n0, k0, lane);
        mma_16x8x16<T>(s[n0 / 8], aq, bk[0], bk[1]);
        mma_16x8x16<T>(s[n0 / 8 + 1], aq, bk[2], bk[3]);
        mma_16x8x16<T>(dp[n0 / 8], ao, bv[0], bv[1]);
        mma_16x8x16<T>(dp[n0 / 8 + 1], ao, bv[2], bv[3]);
      }
    }
    // dS = P (dP - delta), masked; it stays in s.
    const bool masked = cur.masked[0];
    const int32_t base = reg.diff(row0, cur.c0);
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hh = e >> 1;
        const int r = (lane >> 2) + hh * 8, c = j * 8 + (lane & 3) * 2 + (e & 1);
        float p = fast_exp2(fmaf(s[j][e], a.scale_log2, -lse2[hh]));
        if ((cur.cross || masked) && !(cur.c0 + c < reg.col_end && (!masked || visible(a.mask, base + c - r))))
          p = 0.f;
        s[j][e] = p * (dp[j][e] - delta[hh]);
      }
    // dQ += dS K.
#pragma unroll
    for (int k0 = 0; k0 < C::kBlockN; k0 += 16) {
      uint32_t ads[4];
      c_to_a<T>(ads, s[k0 / 8], s[k0 / 8 + 1]);
#pragma unroll
      for (int n0 = 0; n0 < D; n0 += 16) {
        uint32_t b[4];
        load_b_kn<T>(b, k_s, C::kPitch, k0, n0, lane);
        mma_16x8x16<T>(dq[n0 / 8], ads, b[0], b[1]);
        mma_16x8x16<T>(dq[n0 / 8 + 1], ads, b[2], b[3]);
      }
    }
    __syncthreads();
    if constexpr (C::kStages == 1) {
      if (have_next) load_kv(0, nxt.c0);
      cp_async_commit();
    }
    cur = nxt;
    have = have_next;
    st ^= C::kStages - 1;
  }
  cp_async_wait<0>();

  float* dq_g = static_cast<float*>(a.dq.data) + batch * a.dq.batch_stride + head * a.dq.head_stride;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int32_t r = row0 + (lane >> 2) + hh * 8;
    if (r >= m1) continue;
#pragma unroll
    for (int j = 0; j < C::kOTiles; ++j) {
      float2* p = reinterpret_cast<float2*>(dq_g + int64_t(r) * a.dq.token_stride + j * 8 + (lane & 3) * 2);
      float2 x2 = *p;
      x2.x += a.scale * dq[j][2 * hh];
      x2.y += a.scale * dq[j][2 * hh + 1];
      *p = x2;
    }
  }
}

template <class T, int D> void launch_backward(const BackwardParams& p, cudaStream_t stream) {
  AttnArgs a;
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.d_o = p.d_o;
  a.lse = p.lse;
  a.delta = p.delta;
  a.dq = p.dq;
  a.dk = p.dk;
  a.dv = p.dv;
  a.seqlen_q = int32_t(p.seqlen_q);
  a.seqlen_kv = int32_t(p.seqlen_kv);
  a.heads_q = p.heads_q;
  a.group = p.heads_q / p.heads_kv;
  a.scale = p.softmax_scale;
  a.scale_log2 = p.softmax_scale * kLog2e;
  a.mask = make_mask_args(p.mask);
  a.segs = p.segments;
  a.nseg = p.num_segments;
  a.blocks = make_block_args(p.blocks);
  a.accumulate_dq = !p.deterministic;
  {
    using C = BackwardConfig<T, D>;
    const auto kernel = flash_backward_dkdv_kernel<T, D>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes));
    const dim3 grid(unsigned(tile_grid(p.seqlen_kv, C::kBlockN, p.num_segments)), unsigned(p.heads_kv),
                    unsigned(p.batch));
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
    check_launch("flash backward dK/dV");
  }
  if (p.deterministic) {
    using C = DqConfig<T, D>;
    const auto kernel = flash_backward_dq_kernel<T, D>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes));
    const dim3 grid(unsigned(tile_grid(p.seqlen_q, C::kBlockM, p.num_segments)), unsigned(p.heads_q),
                    unsigned(p.batch));
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
    check_launch("flash backward dQ");
  }
}

} // namespace attncore::cuda
